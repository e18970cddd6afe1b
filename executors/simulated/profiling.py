"""Simulated solo profiling and co-location sampling (paper §6: a few dry-run
iterations per new job; ~2,000 co-location samples per GPU type).

Measurements are the interference model's values plus measurement noise, so the
predictor has to learn the relationship from noisy solo features exactly as it
would from a real profiler. Rows are stored with ``source``/``method`` =
``simulated``. ``catalog`` holds the traits on the GPU type being profiled
(``WorkloadCatalog.for_gpu``, ``calibration.catalog_for``): the features and the
labels of one type come from that type's traits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from scheduler_core.domain import OfflineFeatures, OnlineFeatures
from scheduler_core.gpu_specs import get_spec
from scheduler_core.interference.pairs import InterferenceParams, colocate
from scheduler_core.online.load import (
    capacity_qps,
    solo_gpu_util_pct,
    solo_latency_ms,
    solo_sm_activity_pct,
)
from scheduler_core.workloads import ONLINE_FAMILIES, WorkloadCatalog

FEATURE_NOISE = 0.03
LABEL_NOISE = 0.02


def _clock_mhz(gpu_type: str, sm_activity_pct: float) -> float:
    spec = get_spec(gpu_type)
    return spec.max_sm_clock_mhz * (1.0 - spec.clock_drop_frac * max(0.0, (sm_activity_pct / 100.0 - 0.4) / 0.6))


def _jitter(rng: np.random.Generator | None, value: float) -> float:
    return value if rng is None else float(value * (1.0 + rng.normal(0.0, FEATURE_NOISE)))


def offline_profile(
    catalog: WorkloadCatalog, job_type: str, gpu_type: str, rng: np.random.Generator | None = None
) -> OfflineFeatures:
    """Solo features of a job type on a GPU type, as a short profiling run would measure them."""
    wl = catalog.offline_workload(job_type)
    spec = get_spec(gpu_type)
    sm = 100.0 * wl.traits.sm_need
    steps_per_s = wl.solo_steps_per_s_p100 * spec.relative_speed
    return OfflineFeatures(
        gpu_util_pct=min(100.0, _jitter(rng, 92.0 + 6.0 * wl.traits.sm_need)),
        sm_activity_pct=min(100.0, _jitter(rng, sm)),
        # Occupancy tracks how latency-bound (sensitive) the kernels are.
        sm_occupancy_pct=min(100.0, _jitter(rng, 20.0 + 30.0 * min(wl.traits.sensitivity, 1.5))),
        mem_used_bytes=_jitter(rng, wl.mem_bytes),
        mem_bw_util_pct=min(100.0, _jitter(rng, 100.0 * wl.traits.mem_bw)),
        iter_time_s=_jitter(rng, 1.0 / steps_per_s),
        sm_clock_mhz=_jitter(rng, _clock_mhz(gpu_type, sm)),
    )


def online_features(
    catalog: WorkloadCatalog,
    family: str,
    gpu_type: str,
    load: float,
    mem_bytes: float,
    rng: np.random.Generator | None = None,
) -> OnlineFeatures:
    fam = ONLINE_FAMILIES[family]
    spec = get_spec(gpu_type)
    sm = float(solo_sm_activity_pct(load, fam))
    return OnlineFeatures(
        gpu_util_pct=_jitter(rng, float(solo_gpu_util_pct(load, fam))),
        sm_activity_pct=_jitter(rng, sm),
        sm_occupancy_pct=_jitter(rng, 0.55 * sm),
        mem_used_bytes=_jitter(rng, mem_bytes),
        mem_bw_util_pct=_jitter(rng, 100.0 * catalog.online[family].mem_bw * load),
        latency_ms=_jitter(rng, float(solo_latency_ms(load, fam, spec))),
        qps=_jitter(rng, load * capacity_qps(fam, spec)),
        sm_clock_mhz=_jitter(rng, _clock_mhz(gpu_type, sm)),
    )


@dataclass(frozen=True)
class SimulatedSample:
    gpu_type: str
    service_name: str
    job_type: str
    online_features: dict
    offline_features: dict
    sm_pct: float
    offline_norm_tput: float
    online_slowdown: float
    method: str = "simulated"


def colocation_samples(
    catalog: WorkloadCatalog,
    gpu_type: str,
    services: list[tuple[str, str, float]],  # (name, family, mem_bytes)
    job_types: list[str],
    n: int,
    rng: np.random.Generator,
    params: InterferenceParams = InterferenceParams(),
) -> list[SimulatedSample]:
    """``n`` co-location measurements over random (service, load, job type, SM %) points."""
    out = []
    for _ in range(n):
        name, family, mem = services[int(rng.integers(len(services)))]
        job_type = job_types[int(rng.integers(len(job_types)))]
        load = float(rng.uniform(0.05, 1.0))
        sm_pct = float(rng.integers(1, 10) * 10)
        tput, slow = colocate(catalog.online[family], load, catalog.offline_workload(job_type).traits, sm_pct, params)
        out.append(
            SimulatedSample(
                gpu_type=gpu_type,
                service_name=name,
                job_type=job_type,
                online_features=asdict(online_features(catalog, family, gpu_type, load, mem, rng)),
                offline_features=asdict(offline_profile(catalog, job_type, gpu_type, rng)),
                sm_pct=sm_pct,
                offline_norm_tput=max(0.0, float(tput) * (1.0 + rng.normal(0.0, LABEL_NOISE))),
                online_slowdown=max(1.0, float(slow) * (1.0 + rng.normal(0.0, LABEL_NOISE))),
            )
        )
    return out
