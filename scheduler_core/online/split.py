"""The online replica's share of a shared GPU, estimated from its request rate where the driver cannot split it.

The round plans each GPU from the replica's own utilization, SM activity and memory bandwidth over
its recent minutes (the forecast of the next interval's SM activity sets the offline share, paper
§4.3). On a real GPU under MPS those columns are gaps for every minute an offline job shares it:
NVML reports every MPS client's kernels as the MPS server's (docs/NODE_AGENT.md). A replica shared
for hours would then be planned from stale minutes, and one shared for a whole day not at all. Its
request rate is always known (the replica's endpoint), and a replica's own use of the GPU follows
its requests (paper §2.2). So, per service and GPU type, each split column is fitted against the
request rate from the minutes where both are known (the replicas' minutes alone), and a gap minute
with a known rate takes the fitted value:

- the known minutes are binned by request rate (quantile bins); each bin keeps the median rate and
  the median value;
- the curve is made non-decreasing (more requests never need less of the GPU) and is linear between
  bins;
- below the lowest bin it is flat (an overestimate, the safe side: a larger online forecast leaves a
  smaller offline share); above the highest it grows in proportion to the rate (the replica's SM
  activity is proportional to its requests), capped at 100 %.

Too few known minutes (fewer than ``min_points``, or fewer than ``min_bins`` distinct bins): no curve,
and the gaps stay gaps (the round then uses the last measured minutes, as before).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

# The split columns the driver cannot give under MPS (series keys of executors.store.repo.recent_online_series;
# the replica's memory it reports per process).
SPLIT_KEYS = ("gpu_util", "sm", "bw")


@dataclass(frozen=True)
class SplitFitConfig:
    bins: int = 12
    min_points: int = 30
    min_bins: int = 3
    max_points: int = 200_000  # a larger pool is thinned evenly, replica by replica, before it is fitted

    def __post_init__(self) -> None:
        if self.bins < 2 or self.min_bins < 2 or self.min_bins > self.bins or self.min_points < self.min_bins:
            raise ValueError("need 2 <= min_bins <= bins and min_points >= min_bins")
        if self.max_points < self.min_points:
            raise ValueError("max_points must be >= min_points")


@dataclass(frozen=True)
class LoadCurve:
    """A split column (percent) of a replica against its request rate."""

    qps: np.ndarray    # knots, increasing
    value: np.ndarray  # non-decreasing, in [0, 100]

    def at(self, qps) -> np.ndarray:
        x = np.asarray(qps, dtype=float)
        inside = np.interp(x, self.qps, self.value)  # flat below the first knot
        last_q, last_v = float(self.qps[-1]), float(self.value[-1])
        above = last_v * x / last_q if last_q > 0 else np.full(x.shape, last_v)
        return np.clip(np.where(x > last_q, np.maximum(above, last_v), inside), 0.0, 100.0)


def fit_curve(qps, value, cfg: SplitFitConfig = SplitFitConfig()) -> LoadCurve | None:
    """One column's curve from its (rate, value) minutes; NaN or negative minutes are skipped. None: too few."""
    x = np.asarray(qps, dtype=float).reshape(-1)
    y = np.asarray(value, dtype=float).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"{x.size} request rates for {y.size} values")
    ok = np.isfinite(x) & np.isfinite(y) & (x >= 0) & (y >= 0)
    x, y = x[ok], np.minimum(y[ok], 100.0)
    if x.size < cfg.min_points:
        return None
    edges = np.unique(np.quantile(x, np.linspace(0.0, 1.0, cfg.bins + 1)))
    if edges.size < 2:
        return None
    b = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, edges.size - 2)
    knots, vals = [], []
    for k in range(edges.size - 1):
        sel = b == k
        if sel.sum() >= 2:
            knots.append(float(np.median(x[sel])))
            vals.append(float(np.median(y[sel])))
    if len(knots) < cfg.min_bins:
        return None
    kq, kv = np.array(knots), np.maximum.accumulate(np.array(vals))
    keep = np.r_[True, np.diff(kq) > 0]  # equal medians of neighbouring bins: one knot
    return LoadCurve(kq[keep], kv[keep])


def fit_split(series: Iterable[Mapping[str, np.ndarray]], cfg: SplitFitConfig = SplitFitConfig()
              ) -> dict[str, LoadCurve]:
    """Curves for the split columns, pooled over the given replicas' series (one service on one GPU type).

    Only the minutes with both the rate and the column are pooled; beyond ``cfg.max_points`` of them,
    every replica's are thinned by the same stride (a day of 20,000 replicas stays a few MB).
    """
    pooled = list(series)
    out = {}
    for key in SPLIT_KEYS:
        known = [np.isfinite(s["qps"]) & np.isfinite(s[key]) for s in pooled]
        total = sum(int(k.sum()) for k in known)
        if total == 0:
            continue
        stride = -(-total // cfg.max_points)
        x = np.concatenate([s["qps"][k][::stride] for s, k in zip(pooled, known)])
        y = np.concatenate([s[key][k][::stride] for s, k in zip(pooled, known)])
        curve = fit_curve(x, y, cfg)
        if curve is not None:
            out[key] = curve
    return out


def fill_split_gaps(series: Mapping[str, np.ndarray], curves: Mapping[str, LoadCurve]
                    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``series`` with each split column's gap minutes estimated from the request rate where it is known.

    Returns the new series (the input is not changed) and, per minute, whether its SM activity was
    estimated. Columns without a curve keep their gaps.
    """
    out = dict(series)  # the columns without a gap to fill are shared, not copied
    qps = np.asarray(series["qps"], dtype=float)
    filled_sm = np.zeros(qps.shape, dtype=bool)
    for key, curve in curves.items():
        col = np.asarray(series[key], dtype=float)
        gap = ~np.isfinite(col) & np.isfinite(qps) & (qps >= 0)
        if gap.any():
            col = col.copy()
            col[gap] = curve.at(qps[gap])
            out[key] = col
            if key == "sm":
                filled_sm = gap
    return out, filled_sm
