"""Online load forecast for the next interval (paper §2.2: smooth over minutes, periodic over days).

The forecast is deliberately conservative, because under-forecasting hands the
offline job SMs the online service will need: it takes the larger of a recent
high quantile (smoothness) and yesterday's value at the same time of day one
interval ahead (periodicity), when a day of history exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ForecastPolicy:
    recent_minutes: int = 30
    recent_quantile: float = 0.9
    period_minutes: int = 24 * 60
    horizon_minutes: int = 15


def forecast_next(history: np.ndarray, policy: ForecastPolicy = ForecastPolicy()) -> float:
    """Forecast of a per-minute series (oldest first, NaN = gap) for the next interval."""
    h = np.asarray(history, dtype=float)
    valid = h[np.isfinite(h)]
    if valid.size == 0:
        raise ValueError("cannot forecast from an empty or all-NaN history")
    recent = h[-policy.recent_minutes :]
    recent = recent[np.isfinite(recent)]
    base = float(np.quantile(recent if recent.size else valid, policy.recent_quantile))
    if h.size >= policy.period_minutes:
        # Same time yesterday, over the coming interval.
        start = h.size - policy.period_minutes
        window = h[start : start + policy.horizon_minutes]
        window = window[np.isfinite(window)]
        if window.size:
            base = max(base, float(np.max(window)))
    return base
