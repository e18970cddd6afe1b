"""GPU models muxflow knows, with their public specifications.

SM counts, memory and boost clocks are NVIDIA's published figures. The
``relative_speed`` (training throughput vs P100) and ``clock_drop_frac`` are
modelling constants of the simulated cluster only; real clusters measure both.
"""

from __future__ import annotations

from scheduler_core.domain import GpuTypeSpec

GIB = 1024**3

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
    )
}


def get_spec(name: str) -> GpuTypeSpec:
    try:
        return GPU_SPECS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(GPU_SPECS))
        raise KeyError(f"unknown GPU type {name!r} (known: {known})") from None
