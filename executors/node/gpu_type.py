"""Which GPU this node has: its NVML identity, and the muxflow GPU type of it (``--gpu-type auto``).

``gpu_identity(index)`` reads the device's name, memory, the driver and the CUDA version the
driver supports from NVML (nvidia-ml-py); None without NVML or without that GPU.
``resolve_gpu_type(arg)`` turns a command's ``--gpu-type`` into a known type: ``auto`` is the
type of the GPU's NVML name (``scheduler_core.gpu_specs.type_for_device_name``), any other
value must be a known type's name. Its errors are one line (:class:`GpuTypeError`, a
ValueError), for a command's ``error: ...``.

``index`` is NVML's device index, which ``CUDA_VISIBLE_DEVICES`` does not renumber.
"""

from __future__ import annotations

from typing import Any

from executors.node.sampler import nvml_available
from scheduler_core.gpu_specs import UnknownGpuDevice, get_spec, known_types, type_for_device_name

AUTO = "auto"


class GpuTypeError(ValueError):
    """A ``--gpu-type`` that names no known type, or ``auto`` where no known GPU is found."""


def _line(value: Any) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return " ".join(text.split())


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version (``nvmlSystemGetCudaDriverVersion``: 1000 × major + 10 × minor) as "13.0"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def read_identity(index: int = 0, nvml: Any = None) -> tuple[dict[str, Any] | None, str]:
    """(identity, "") or (None, why there is none)."""
    ok, why = nvml_available(nvml)
    if not ok:
        return None, why
    if nvml is None:
        import pynvml as nvml
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVML went away since the check: as nvml_available says it
        return None, f"nvmlInit failed: {_line(exc)}"
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if not 0 <= index < count:
            return None, f"no GPU {index}: NVML sees {count} GPU{'' if count == 1 else 's'}"
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        identity: dict[str, Any] = {
            "name": _line(nvml.nvmlDeviceGetName(handle)),
            "driver": _line(nvml.nvmlSystemGetDriverVersion()),
            "cuda": None,
            "memory_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            "index": index,
        }
        try:
            identity["cuda"] = cuda_version_text(int(nvml.nvmlSystemGetCudaDriverVersion()))
        except error:
            pass  # an old driver: the identity without it
        return identity, ""
    except error as exc:
        return None, f"NVML could not read GPU {index}: {_line(exc)}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: S110 - nothing to undo
            pass


def gpu_identity(index: int = 0, nvml: Any = None) -> dict[str, Any] | None:
    """``{"name", "driver", "cuda", "memory_bytes", "index"}`` of NVML's GPU ``index``, or None (no NVML, no GPU).

    ``cuda`` is the newest CUDA version the driver supports ("13.0"; None where NVML cannot say).
    """
    return read_identity(index, nvml)[0]


def resolve_gpu_type(arg: str, index: int = 0, nvml: Any = None) -> str:
    """The known GPU type ``arg`` names; ``auto``: the type of NVML's GPU ``index``. Raises :class:`GpuTypeError`."""
    name = _line(arg).lower()
    if name != AUTO:
        try:
            return get_spec(name).name
        except KeyError:
            raise GpuTypeError(f"gpu-type: unknown GPU type {arg!r} (known: {known_types()}; or auto)") from None
    identity, why = read_identity(index, nvml)
    if identity is None:
        raise GpuTypeError(f"gpu-type auto: no GPU to read the type of ({why}); name the type instead "
                           f"(known: {known_types()})")
    try:
        return type_for_device_name(identity["name"], identity["memory_bytes"])
    except UnknownGpuDevice as exc:
        raise GpuTypeError(f"gpu-type auto: {exc}") from None
