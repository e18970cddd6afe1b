"""Feature vectors of (online service, offline job, SM percentage) triples (docs/DESIGN.md §5).

The speed predictor sees only solo features: what the GPU monitor reports for
the online service and what profiling measured for the offline job, plus the SM
percentage the offline job would get (paper §5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from scheduler_core.domain import OfflineFeatures, OnlineFeatures

# What a GPU monitor reports for an online service over the last interval, by these keys.
RECENT_ONLINE_KEYS = ("gpu_util", "sm", "mem", "bw", "latency", "qps", "clock")


def round_online_features(recent: Mapping[str, float], forecast_sm_pct: float) -> OnlineFeatures:
    """An online service's features as a round sees them (docs/DESIGN.md §5).

    ``recent``: means over the last interval (:data:`RECENT_ONLINE_KEYS`); SM activity is the
    forecast for the next interval (the share is planned for it), occupancy 0.55 of that.
    """
    fc = float(forecast_sm_pct)
    return OnlineFeatures(
        gpu_util_pct=float(recent["gpu_util"]), sm_activity_pct=fc, sm_occupancy_pct=0.55 * fc,
        mem_used_bytes=float(recent["mem"]), mem_bw_util_pct=float(recent["bw"]),
        latency_ms=float(recent["latency"]), qps=float(recent["qps"]), sm_clock_mhz=float(recent["clock"]),
    )


FEATURE_NAMES: tuple[str, ...] = (
    "on_gpu_util_pct",
    "on_sm_activity_pct",
    "on_sm_occupancy_pct",
    "on_mem_frac",
    "on_mem_bw_util_pct",
    "on_log_latency_ms",
    "on_qps",
    "on_sm_clock_frac",
    "off_gpu_util_pct",
    "off_sm_activity_pct",
    "off_sm_occupancy_pct",
    "off_mem_frac",
    "off_mem_bw_util_pct",
    "off_log_iter_time_s",
    "off_sm_clock_frac",
    "sm_pct",
)
N_FEATURES = len(FEATURE_NAMES)
ONLINE_SLICE = slice(0, 8)
OFFLINE_SLICE = slice(8, 15)
SM_COLUMN = 15

# Values no GPU can report: percentages outside [0, 100] (a little slack for
# sampling noise), negative rates or memory, clocks far above the boost clock.
# A row outside these bounds is a broken measurement, not an unusual workload.
_PCT = (0.0, 105.0)
_FRAC = (0.0, 1.25)
PHYSICAL_BOUNDS: dict[str, tuple[float, float]] = {
    "on_gpu_util_pct": _PCT,
    "on_sm_activity_pct": _PCT,
    "on_sm_occupancy_pct": _PCT,
    "on_mem_frac": _FRAC,
    "on_mem_bw_util_pct": _PCT,
    "on_log_latency_ms": (-7.0, 12.0),  # 1 µs … 45 h
    "on_qps": (0.0, 1e7),
    "on_sm_clock_frac": _FRAC,
    "off_gpu_util_pct": _PCT,
    "off_sm_activity_pct": _PCT,
    "off_sm_occupancy_pct": _PCT,
    "off_mem_frac": _FRAC,
    "off_mem_bw_util_pct": _PCT,
    "off_log_iter_time_s": (-14.0, 12.0),
    "off_sm_clock_frac": _FRAC,
    "sm_pct": (0.0, 100.0),
}


class FeatureError(ValueError):
    """A feature that is missing, NaN, infinite or outside the range a model accepts."""


def describe_bad_rows(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, limit: int = 3) -> str:
    """Human-readable list of the first offending cells: feature, row, value, accepted range."""
    bad = ~np.isfinite(x) | (x < lo) | (x > hi)
    parts = []
    for r, c in np.argwhere(bad)[:limit]:
        parts.append(f"{FEATURE_NAMES[c]}={float(x[r, c])!r} in row {int(r)} (accepted [{lo[c]:.6g}, {hi[c]:.6g}])")
    more = int(bad.sum()) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def online_vector(f: OnlineFeatures, memory_bytes: float, max_clock_mhz: float) -> np.ndarray:
    return np.array(
        [
            f.gpu_util_pct,
            f.sm_activity_pct,
            f.sm_occupancy_pct,
            f.mem_used_bytes / memory_bytes,
            f.mem_bw_util_pct,
            math.log(max(f.latency_ms, 1e-3)),
            f.qps,
            f.sm_clock_mhz / max_clock_mhz,
        ],
        dtype=np.float64,
    )


def offline_vector(f: OfflineFeatures, memory_bytes: float, max_clock_mhz: float) -> np.ndarray:
    return np.array(
        [
            f.gpu_util_pct,
            f.sm_activity_pct,
            f.sm_occupancy_pct,
            f.mem_used_bytes / memory_bytes,
            f.mem_bw_util_pct,
            math.log(max(f.iter_time_s, 1e-6)),
            f.sm_clock_mhz / max_clock_mhz,
        ],
        dtype=np.float64,
    )


def pair_matrix(
    online: np.ndarray, offline: np.ndarray, sm_pct: np.ndarray | Sequence[float]
) -> np.ndarray:
    """Stack row-aligned online (n×8), offline (n×7) vectors and SM% (n) into n×16."""
    sm = np.asarray(sm_pct, dtype=np.float64).reshape(-1, 1)
    x = np.hstack([np.atleast_2d(online), np.atleast_2d(offline), sm])
    if x.shape[1] != N_FEATURES:
        raise FeatureError(f"expected {N_FEATURES} features, got {x.shape[1]}")
    if not np.all(np.isfinite(x)):
        bad = sorted({FEATURE_NAMES[j] for j in np.argwhere(~np.isfinite(x))[:, 1]})
        raise FeatureError(f"non-finite feature values in: {', '.join(bad)}")
    return x
