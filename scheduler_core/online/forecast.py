"""Online load forecast for the next interval (paper §2.2: smooth over minutes, periodic over days).

The forecast is what dynamic SM allocation (§4.3) leaves to the online
service, so it aims at the *peak* of the coming interval, and errs high:
under-forecasting hands the offline job SMs the online service will need.

- **Periodic part.** For each of the last ``days`` days, the peak (or
  ``seasonal_quantile``) of that day's same ``horizon_minutes`` window,
  shifted by how much today's level differs from that day's level just
  before the window (mean of ``level_minutes``). The median over days resists
  one odd day.
- **Smooth part.** A high quantile of the last ``recent_minutes``; without a
  day of history it is the forecast, otherwise a floor under the periodic part
  (``conservative``).

Histories are per-minute series, oldest first; NaN marks a missing sample.
:func:`forecast_many` forecasts many GPUs at once with the same rules;
:func:`backtest` scores a policy against the last-value baseline.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ForecastPolicy:
    recent_minutes: int = 30
    recent_quantile: float = 0.9
    period_minutes: int = 24 * 60
    horizon_minutes: int = 15
    level_minutes: int = 15
    days: int = 7
    seasonal_quantile: float = 1.0
    level_shift: bool = True  # correct each past day by today's level difference
    conservative: bool = True  # never below the recent quantile

    def __post_init__(self) -> None:
        if min(self.recent_minutes, self.period_minutes, self.horizon_minutes, self.level_minutes, self.days) < 1:
            raise ValueError("forecast windows and days must be >= 1")
        if not (0.0 <= self.recent_quantile <= 1.0 and 0.0 <= self.seasonal_quantile <= 1.0):
            raise ValueError("quantiles must lie in [0, 1]")


def forecast_next(history: np.ndarray, policy: ForecastPolicy = ForecastPolicy()) -> float:
    """Forecast SM activity (%) of one online GPU for the next interval."""
    h = np.asarray(history, dtype=float).reshape(-1)
    if not np.isfinite(h).any():
        raise ValueError("cannot forecast from an empty or all-NaN history")
    return float(forecast_many(h[None, :], policy)[0])


def forecast_many(histories: np.ndarray, policy: ForecastPolicy = ForecastPolicy()) -> np.ndarray:
    """:func:`forecast_next` for each row of a (GPUs × minutes) array; NaN for a row with no data."""
    h = np.asarray(histories, dtype=float)
    if h.ndim != 2:
        raise ValueError(f"expected a (series, minutes) array, got shape {h.shape}")
    rows, size = h.shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices → NaN, handled below
        recent = _nanquantile(h[:, -policy.recent_minutes :], policy.recent_quantile)
        recent = np.where(np.isfinite(recent), recent, _nanquantile(h, policy.recent_quantile))
        out = recent.copy()
        if size >= policy.period_minutes:
            level_now = np.nanmean(h[:, -policy.level_minutes :], axis=1)
            per_day = []
            for d in range(1, policy.days + 1):
                start = size - d * policy.period_minutes
                if start < 0:
                    break
                window = h[:, start : start + policy.horizon_minutes]
                peak = _nanquantile(window, policy.seasonal_quantile)
                if policy.level_shift and start > 0:
                    before = np.nanmean(h[:, max(0, start - policy.level_minutes) : start], axis=1)
                    shift = np.where(np.isfinite(before) & np.isfinite(level_now), level_now - before, 0.0)
                else:
                    shift = np.zeros(rows)
                per_day.append(peak + shift)
            seasonal = np.nanmedian(np.vstack(per_day), axis=0)
            have = np.isfinite(seasonal)
            if policy.conservative:
                out[have] = np.maximum(seasonal[have], recent[have])
            else:
                out[have] = seasonal[have]
    return np.clip(out, 0.0, 100.0)


def _nanquantile(a: np.ndarray, q: float) -> np.ndarray:
    if a.shape[1] == 0:
        return np.full(a.shape[0], np.nan)
    if q >= 1.0:
        return np.nanmax(a, axis=1)
    return np.nanquantile(a, q, axis=1)


def last_value(histories: np.ndarray) -> np.ndarray:
    """The baseline: each series' most recent valid sample."""
    h = np.asarray(histories, dtype=float)
    valid = np.isfinite(h)
    idx = h.shape[1] - 1 - np.argmax(valid[:, ::-1], axis=1)
    out = h[np.arange(h.shape[0]), idx]
    out[~valid.any(axis=1)] = np.nan
    return out


@dataclass(frozen=True)
class ForecastErrors:
    intervals: int
    mae_vs_mean: float  # |forecast − mean SM % of the interval|
    mae_vs_peak: float  # |forecast − peak SM % of the interval|
    under_peak_rate: float  # share of intervals whose peak exceeds the forecast
    shortfall_rate: float  # share of intervals whose peak exceeds forecast + headroom
    mean_reserve: float  # mean of (forecast − interval mean): SMs kept from offline work

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def backtest(
    traces: np.ndarray,
    policy: ForecastPolicy = ForecastPolicy(),
    warmup_minutes: int = 24 * 60,
    step_minutes: int | None = None,
    headroom_pct: float = 10.0,
) -> dict[str, ForecastErrors]:
    """Forecast every interval after ``warmup_minutes`` from the history before it; score against the truth.

    Returns errors for the policy (``forecaster``) and the ``last_value`` baseline.
    """
    tr = np.asarray(traces, dtype=float)
    horizon = policy.horizon_minutes
    step = step_minutes or horizon
    preds: dict[str, list[np.ndarray]] = {"forecaster": [], "last_value": []}
    means, peaks = [], []
    keep = policy.days * policy.period_minutes + policy.level_minutes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for t in range(warmup_minutes, tr.shape[1] - horizon + 1, step):
            hist = tr[:, max(0, t - keep) : t]
            preds["forecaster"].append(forecast_many(hist, policy))
            preds["last_value"].append(last_value(hist))
            future = tr[:, t : t + horizon]
            means.append(np.nanmean(future, axis=1))
            peaks.append(np.nanmax(future, axis=1))
    mean_a, peak_a = np.concatenate(means), np.concatenate(peaks)
    out = {}
    for name, p in preds.items():
        f = np.concatenate(p)
        ok = np.isfinite(f) & np.isfinite(mean_a) & np.isfinite(peak_a)
        out[name] = ForecastErrors(
            intervals=int(ok.sum()),
            mae_vs_mean=float(np.mean(np.abs(f[ok] - mean_a[ok]))),
            mae_vs_peak=float(np.mean(np.abs(f[ok] - peak_a[ok]))),
            under_peak_rate=float(np.mean(peak_a[ok] > f[ok])),
            shortfall_rate=float(np.mean(peak_a[ok] > f[ok] + headroom_pct)),
            mean_reserve=float(np.mean(f[ok] - mean_a[ok])),
        )
    return out
