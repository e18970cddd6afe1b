"""Where a reference workload runs: ``auto`` (CUDA when torch sees a GPU, else CPU), ``cpu`` or ``cuda[:i]``."""

from __future__ import annotations

import platform

import torch


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name} asked for, but torch {torch.__version__} sees no CUDA GPU")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected auto, cpu or cuda[:i], got {name!r}")
    return dev


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA is asynchronous: a latency must include the kernels)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(idx)} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__})"


def set_threads(device: torch.device, threads: int | None) -> None:
    """CPU threads for torch; on a shared CPU (tests, co-location on CPU) one each keeps runs comparable."""
    if threads is not None:
        if threads < 1:
            raise ValueError("threads: must be >= 1")
        torch.set_num_threads(threads)
