"""Dynamic SM allocation (paper §4.3, docs/DESIGN.md §6).

The offline job gets the SMs the online service is predicted to leave idle:
``pct_off = clamp(100 − forecast_online_sm_pct − headroom, min_pct, max_pct)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SmPolicy:
    headroom_pct: float = 10.0
    min_pct: int = 10
    max_pct: int = 90
    # MuxFlow-S (paper §7.4) uses one fixed percentage for every pair.
    fixed_pct: int | None = None
    # Smaller shares a round may fall back to when a pair's predicted online slowdown is
    # over the allowance at the dynamic share (0 = the paper: the dynamic share only).
    # Five levels of 15 points reach from the largest dynamic share (90 %) down to 15 %: a GPU
    # whose replica is sensitive to any contention still takes a job at a small share rather
    # than none (docs/EVALUATION.md: it is what lets MuxFlow's JCT under overload beat Salus's).
    fallback_levels: int = 5
    fallback_step_pct: int = 15

    def __post_init__(self) -> None:
        if not 1 <= self.min_pct <= self.max_pct <= 100:
            raise ValueError("SM bounds must satisfy 1 <= min_pct <= max_pct <= 100")
        if self.headroom_pct < 0:
            raise ValueError("headroom_pct must be >= 0")
        if self.fallback_levels < 0 or self.fallback_step_pct < 1:
            raise ValueError("fallback_levels must be >= 0 and fallback_step_pct >= 1")


def offline_sm_pct(forecast_online_sm_pct: np.ndarray | float, policy: SmPolicy = SmPolicy()) -> np.ndarray:
    """Integer SM percentage for the offline job on each GPU (Slurm's MPS share is integral)."""
    f = np.asarray(forecast_online_sm_pct, dtype=float)
    if policy.fixed_pct is not None:
        return np.full(f.shape, int(policy.fixed_pct), dtype=int)
    raw = np.floor(100.0 - f - policy.headroom_pct)
    return np.clip(raw, policy.min_pct, policy.max_pct).astype(int)
