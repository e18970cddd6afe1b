"""GPU models muxflow knows, with their public specifications, and the NVML device names of each.

SM counts, memory and boost clocks are NVIDIA's published figures. The
``relative_speed`` (training throughput vs P100) and ``clock_drop_frac`` are
modelling constants of the simulated cluster only; real clusters measure both.

How the constants of H200, L40S and L4 were chosen:

- ``relative_speed``: among the existing tensor-core types of one class, the constants follow
  the square root of the published dense FP16/BF16 tensor throughput (A10 125, A100 312,
  H100 SXM 989 TFLOPS: √(989/312) × 3.2 = 5.7 ≈ 5.5, √(125/312) × 3.2 = 2.0 ≈ 1.9). A new type
  takes that rule from its nearest existing type of the same class: L40S (362 TFLOPS, GDDR6,
  PCIe, 350 W) from A10: 1.9 × √(362/125) = 3.2; L4 (121 TFLOPS, 72 W) from the 70 W T4
  (65 TFLOPS): 0.85 × √(121/65) = 1.16. H200 has H100's tensor throughput with 1.43×
  the memory bandwidth (4.8 vs 3.35 TB/s); training steps are partly bandwidth-bound, credited
  at the fourth root: 5.5 × 1.43^0.25 = 6.0.
- ``clock_drop_frac``: by power class, as the existing ones: a 700 W SXM part holds its clock
  (H200: H100's die and power, its 0.05), the 350 W L40S 0.12 (between A100's 0.05 and the
  150 W A10's 0.15), the 72 W L4 0.30 (above the 70 W T4's 0.28: a higher boost clock to fall from).
"""

from __future__ import annotations

import re

from scheduler_core.domain import GpuTypeSpec

GIB = 1024**3
MIB = 1024**2

GPU_SPECS: dict[str, GpuTypeSpec] = {
    spec.name: spec
    for spec in (
        # K80 and P100 are the GPUs of the measured co-location data (Gavel).
        GpuTypeSpec("k80", sm_count=13, memory_bytes=12 * GIB, max_sm_clock_mhz=875,
                    relative_speed=0.45, clock_drop_frac=0.10),
        GpuTypeSpec("p100", sm_count=56, memory_bytes=16 * GIB, max_sm_clock_mhz=1328,
                    relative_speed=1.0, clock_drop_frac=0.08),
        # T4: 70 W inference card whose clock sags under load (paper §4.1).
        GpuTypeSpec("t4", sm_count=40, memory_bytes=15 * GIB, max_sm_clock_mhz=1590,
                    relative_speed=0.85, clock_drop_frac=0.28),
        GpuTypeSpec("a10", sm_count=72, memory_bytes=24 * GIB, max_sm_clock_mhz=1695,
                    relative_speed=1.9, clock_drop_frac=0.15),
        GpuTypeSpec("a100", sm_count=108, memory_bytes=80 * GIB, max_sm_clock_mhz=1410,
                    relative_speed=3.2, clock_drop_frac=0.05),
        GpuTypeSpec("h100", sm_count=132, memory_bytes=80 * GIB, max_sm_clock_mhz=1980,
                    relative_speed=5.5, clock_drop_frac=0.05),
        # 141 GB of HBM3e: NVML reports 143,771 MiB.
        GpuTypeSpec("h200", sm_count=132, memory_bytes=143_771 * MIB, max_sm_clock_mhz=1980,
                    relative_speed=6.0, clock_drop_frac=0.05),
        GpuTypeSpec("l40s", sm_count=142, memory_bytes=48 * GIB, max_sm_clock_mhz=2520,
                    relative_speed=3.2, clock_drop_frac=0.12),
        # L4: 72 W, like the T4 a card whose clock sags under load.
        GpuTypeSpec("l4", sm_count=58, memory_bytes=24 * GIB, max_sm_clock_mhz=2040,
                    relative_speed=1.16, clock_drop_frac=0.30),
    )
}


class UnknownGpuType(KeyError):
    """A GPU type name muxflow does not know. A KeyError (as it always was), printed as its one-line message
    (a plain KeyError prints its message quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown GPU type"


class UnknownGpuDevice(ValueError):
    """An NVML device name that is none of the known types (or a smaller-memory variant of one)."""


def known_types() -> str:
    return ", ".join(sorted(GPU_SPECS))


def get_spec(name: str) -> GpuTypeSpec:
    try:
        return GPU_SPECS[name.lower()]
    except (KeyError, AttributeError):
        raise UnknownGpuType(f"unknown GPU type {name!r} (known: {known_types()})") from None


# The model in an NVML device name (after "NVIDIA " / "Tesla "): "H100 80GB HBM3", "A100-SXM4-80GB",
# "P100-PCIE-16GB", "L40S", "H200 NVL". The first token is the model; "<n>GB" anywhere is its memory.
# Form factors of one model are one type (H100 PCIe and NVL are h100, H200 NVL is h200): the simulated
# cluster's constants are the SXM part's; a site measures its own. A model not listed (L40, A10G, V100, …)
# is unknown rather than guessed.
_MODEL_OF_TOKEN = {"K80": "k80", "P100": "p100", "T4": "t4", "A10": "a10", "A100": "a100", "H100": "h100",
                   "H200": "h200", "L40S": "l40s", "L4": "l4"}
_PREFIX = re.compile(r"^(?:NVIDIA\s+)?(?:TESLA\s+)?", re.I)
_GB = re.compile(r"(?:^|[\s-])(\d+)\s*GB(?:$|[\s-])", re.I)
MEMORY_FIT = 0.9  # a device with less than this share of its type's memory is not that type


def type_for_device_name(device_name: str, memory_bytes: int | None = None) -> str:
    """The GPU type of an NVML device name (``nvmlDeviceGetName``): ``"NVIDIA H200"`` → ``"h200"``.

    A variant with less memory than its type (``"NVIDIA A100-SXM4-40GB"`` against ``a100``'s 80 GiB),
    by the size in its name or by ``memory_bytes`` (NVML's total) when given, is no known type:
    the scheduler would place jobs on it that do not fit. Raises :class:`UnknownGpuDevice` (one line).
    """
    name = " ".join(str(device_name).split())
    rest = _PREFIX.sub("", name)
    token = re.split(r"[\s-]", rest, maxsplit=1)[0].upper() if rest else ""
    gpu_type = _MODEL_OF_TOKEN.get(token)
    if gpu_type is None:
        raise UnknownGpuDevice(f"GPU device {name!r} is none of the known GPU types ({known_types()})")
    spec = GPU_SPECS[gpu_type]
    need = MEMORY_FIT * spec.memory_bytes
    m = _GB.search(rest)
    named = int(m.group(1)) * GIB if m else None
    for what, have in (("its name says", named), ("NVML reports", memory_bytes)):
        if have is not None and have < need:
            raise UnknownGpuDevice(
                f"GPU device {name!r} is a {token} with less memory ({what} {have / GIB:.0f} GiB) than the "
                f"{gpu_type} type's {spec.memory_bytes / GIB:.0f} GiB: no known GPU type fits it "
                f"({known_types()})")
    return gpu_type
