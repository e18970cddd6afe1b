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
from scheduler_core.online.latency_model import P99_OF_MEAN
from scheduler_core.workloads import OnlineFamily


def diurnal_qps(hour_utc: np.ndarray | float, qps_min: float, qps_max: float, peak_hour_utc: float) -> np.ndarray:
    phase = 2.0 * math.pi * (np.asarray(hour_utc, dtype=float) - peak_hour_utc) / 24.0
    return qps_min + (qps_max - qps_min) * 0.5 * (1.0 + np.cos(phase))


def capacity_qps(family: OnlineFamily, spec: GpuTypeSpec) -> float:
    return family.peak_qps_capacity_p100 * spec.relative_speed


def load_of(qps: np.ndarray | float, family: OnlineFamily, spec: GpuTypeSpec) -> np.ndarray:
    return load_at(qps, capacity_qps(family, spec))


def base_latency_ms(family: OnlineFamily, spec: GpuTypeSpec) -> float:
    """A request's service time alone on ``spec``, with no queueing: shorter on faster GPUs."""
    return family.base_latency_ms_p100 / math.sqrt(spec.relative_speed)


def solo_gpu_util_pct(load: np.ndarray | float, family: OnlineFamily) -> np.ndarray:
    return util_at_load_pct(load, family.gpu_util_at_peak_pct)


def solo_sm_activity_pct(load: np.ndarray | float, family: OnlineFamily) -> np.ndarray:
    return sm_at_load_pct(load, family.sm_need_at_peak)


def solo_latency_ms(load: np.ndarray | float, family: OnlineFamily, spec: GpuTypeSpec) -> np.ndarray:
    return latency_at_load_ms(load, base_latency_ms(family, spec))


def peak_slo_ms(family: OnlineFamily, specs: list[GpuTypeSpec], qps_max: float, scale: float = 1.0,
                step_ms: float = 10.0) -> float:
    """A p99 SLO of ``scale`` times what the service has alone at its daily peak on the slowest of ``specs``
    (p99 = mean · ln 100, an M/M/1 sojourn), rounded up to ``step_ms`` (how simulated sites declare SLOs)."""
    worst = max(float(solo_latency_ms(load_of(qps_max, family, sp), family, sp)) for sp in specs)
    return math.ceil(scale * worst * P99_OF_MEAN / step_ms) * step_ms


# The same relations on their parameters alone (scalars or one value per GPU), for the
# vectorized simulator and the per-GPU model of scheduler_core.interference.gpu_model.
def load_at(qps: np.ndarray | float, capacity_qps_: np.ndarray | float) -> np.ndarray:
    return np.clip(np.asarray(qps, dtype=float) / capacity_qps_, 0.0, 1.0)


def util_at_load_pct(load: np.ndarray | float, util_at_peak_pct: np.ndarray | float) -> np.ndarray:
    # Small-batch inference keeps the GPU busy in time faster than in space.
    return util_at_peak_pct * np.asarray(load, dtype=float) ** 0.7


def sm_at_load_pct(load: np.ndarray | float, sm_need_at_peak: np.ndarray | float) -> np.ndarray:
    return 100.0 * sm_need_at_peak * np.asarray(load, dtype=float)


def latency_at_load_ms(load: np.ndarray | float, base_latency_ms_: np.ndarray | float) -> np.ndarray:
    # Queueing grows with load (an M/M/1-like term, capped before saturation).
    rho = np.minimum(np.asarray(load, dtype=float), 0.95)
    return base_latency_ms_ * (1.0 + 0.5 * rho**2 / (1.0 - rho))


def simulated_sm_trace(
    minutes: int,
    family: OnlineFamily,
    rng: np.random.Generator,
    qps_lo_frac: float = 0.15,
    qps_hi_frac: float = 0.85,
    peak_hour_utc: float = 20.0,
    day_jitter: float = 0.08,
    noise: float = 0.04,
    bursts_per_day: float = 2.0,
    gap_frac: float = 0.005,
) -> np.ndarray:
    """Per-minute SM activity (%) of one online GPU: daily cycle, day-to-day change, smooth noise, bursts, gaps.

    Load is a fraction of capacity following :func:`diurnal_qps` between
    ``qps_lo_frac`` and ``qps_hi_frac``; each day's amplitude varies by
    ``day_jitter`` (blended across midnight), AR(1) noise keeps it smooth over
    minutes (paper §2.2), and a few bursts per day add 10–40 % load for 5–30
    minutes. ``gap_frac`` of the samples are missing (NaN), as from a monitor.
    """
    t = np.arange(minutes, dtype=float)
    hours = t / 60.0
    days = int(np.ceil(minutes / 1440.0)) + 1
    factors = 1.0 + rng.normal(0.0, day_jitter, days)
    day_pos = hours / 24.0
    d0 = np.floor(day_pos).astype(int)
    blend = 0.5 - 0.5 * np.cos(np.pi * (day_pos - d0))  # smooth from one day's factor to the next
    factor = factors[d0] * (1.0 - blend) + factors[np.minimum(d0 + 1, days - 1)] * blend
    load = diurnal_qps(hours % 24.0, qps_lo_frac, qps_hi_frac, peak_hour_utc) * factor
    ar = np.empty(minutes)
    eps = rng.normal(0.0, noise * np.sqrt(1 - 0.9**2), minutes)
    prev = 0.0
    for i in range(minutes):  # AR(1), φ = 0.9: correlated over ~10 minutes
        prev = 0.9 * prev + eps[i]
        ar[i] = prev
    load = load * (1.0 + ar)
    for _ in range(rng.poisson(bursts_per_day * minutes / 1440.0)):
        start = int(rng.integers(0, minutes))
        length = int(rng.integers(5, 31))
        load[start : start + length] += float(rng.uniform(0.1, 0.4)) * np.sin(np.linspace(0.2, np.pi - 0.2, length))[
            : max(0, min(length, minutes - start))
        ]
    sm = solo_sm_activity_pct(np.clip(load, 0.0, 1.0), family) + rng.normal(0.0, 0.5, minutes)
    sm = np.clip(sm, 0.0, 100.0)
    sm[rng.random(minutes) < gap_frac] = np.nan
    return sm
