"""Online service load and solo metrics as functions of request rate (paper §2.2, §7.1).

Request rates follow a daily cycle between ``qps_min`` and ``qps_max`` (the
paper's services see 20–190 QPS) peaking at ``peak_hour_utc``. A replica's load
is its rate over the replica's capacity on that GPU type; utilization, SM
activity and latency follow from the load.
"""

from __future__ import annotations

import math

import numpy as np

from scheduler_core.domain import GpuTypeSpec
from scheduler_core.workloads import OnlineFamily


def diurnal_qps(hour_utc: np.ndarray | float, qps_min: float, qps_max: float, peak_hour_utc: float) -> np.ndarray:
    phase = 2.0 * math.pi * (np.asarray(hour_utc, dtype=float) - peak_hour_utc) / 24.0
    return qps_min + (qps_max - qps_min) * 0.5 * (1.0 + np.cos(phase))


def capacity_qps(family: OnlineFamily, spec: GpuTypeSpec) -> float:
    return family.peak_qps_capacity_p100 * spec.relative_speed


def load_of(qps: np.ndarray | float, family: OnlineFamily, spec: GpuTypeSpec) -> np.ndarray:
    return np.clip(np.asarray(qps, dtype=float) / capacity_qps(family, spec), 0.0, 1.0)


def solo_gpu_util_pct(load: np.ndarray | float, family: OnlineFamily) -> np.ndarray:
    # Small-batch inference keeps the GPU busy in time faster than in space.
    return family.gpu_util_at_peak_pct * np.asarray(load, dtype=float) ** 0.7


def solo_sm_activity_pct(load: np.ndarray | float, family: OnlineFamily) -> np.ndarray:
    return 100.0 * family.sm_need_at_peak * np.asarray(load, dtype=float)


def solo_latency_ms(load: np.ndarray | float, family: OnlineFamily, spec: GpuTypeSpec) -> np.ndarray:
    # Service time shrinks on faster GPUs; queueing grows with load.
    rho = np.minimum(np.asarray(load, dtype=float), 0.95)
    return family.base_latency_ms_p100 / math.sqrt(spec.relative_speed) * (1.0 + 0.5 * rho**2 / (1.0 - rho))
