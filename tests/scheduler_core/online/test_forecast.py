"""Online load forecast (paper §2.2) and dynamic SM from it (§4.3), on hand-built series.

The basic recent-quantile / yesterday-window cases are in test_units.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_core.online.dynamic_sm import SmPolicy, offline_sm_pct
from scheduler_core.online.forecast import ForecastPolicy, backtest, forecast_many, forecast_next, last_value
from scheduler_core.online.load import simulated_sm_trace
from scheduler_core.workloads import ONLINE_FAMILIES

P = 24 * 60  # minutes per day
POL = ForecastPolicy()


def flat_days(days: int, level: float) -> np.ndarray:
    return np.full(days * P, level)


def test_level_shift_moves_yesterday_to_today() -> None:
    # Yesterday: level 30 just before the window, peak 40 in it. Today's level is 50: 20 higher → 60.
    h = np.full(P + 15, 30.0)
    h[15:30] = 40.0  # starts exactly one day before now
    h[-15:] = 50.0
    assert forecast_next(h, ForecastPolicy(conservative=False)) == pytest.approx(60.0)
    # Without the level correction only yesterday's peak counts.
    assert forecast_next(h, ForecastPolicy(conservative=False, level_shift=False)) == pytest.approx(40.0)


def test_median_over_days_ignores_one_odd_day() -> None:
    h = flat_days(3, 20.0)
    windows = [h.size - d * P for d in (1, 2, 3)]
    for start, peak in zip(windows, (30.0, 90.0, 32.0)):  # a burst two days ago
        h[start : start + 15] = peak
    assert forecast_next(h, ForecastPolicy(conservative=False)) == pytest.approx(32.0)
    assert forecast_next(h, ForecastPolicy(conservative=False, days=1)) == pytest.approx(30.0)


def test_seasonal_quantile_of_the_window() -> None:
    h = flat_days(1, 10.0)
    h = np.concatenate([np.full(15, 10.0), h])
    h[15:30] = np.linspace(20.0, 48.0, 15)
    assert forecast_next(h, ForecastPolicy(conservative=False, seasonal_quantile=0.5)) == pytest.approx(34.0)
    assert forecast_next(h, ForecastPolicy(conservative=False)) == pytest.approx(48.0)


def test_conservative_floor_is_the_recent_quantile() -> None:
    # Load falling: yesterday's window says 20, the last half hour ran at 70.
    h = flat_days(1, 20.0)
    h = np.concatenate([np.full(15, 20.0), h])
    h[-30:] = 70.0
    assert forecast_next(h, ForecastPolicy(level_shift=False)) == pytest.approx(70.0)
    assert forecast_next(h, ForecastPolicy(level_shift=False, conservative=False)) == pytest.approx(20.0)


def test_a_day_whose_window_is_missing_is_skipped() -> None:
    h = flat_days(2, 15.0)
    h[h.size - P : h.size - P + 15] = np.nan  # yesterday's window lost
    h[h.size - 2 * P : h.size - 2 * P + 15] = 45.0
    assert forecast_next(h, ForecastPolicy(conservative=False)) == pytest.approx(45.0)


def test_forecast_is_a_percentage() -> None:
    h = flat_days(1, 95.0)
    h = np.concatenate([np.full(15, 40.0), h])  # level jumps by 55 since yesterday
    assert forecast_next(h, ForecastPolicy(conservative=False)) == 100.0


def test_forecast_many_equals_forecast_next_per_row() -> None:
    rng = np.random.default_rng(4)
    rows = np.stack([simulated_sm_trace(P + 200, ONLINE_FAMILIES["cnn"], rng) for _ in range(5)])
    rows[2, -40:] = np.nan  # a GPU whose monitor stopped 40 minutes ago
    got = forecast_many(rows, POL)
    for r in range(5):
        assert got[r] == pytest.approx(forecast_next(rows[r], POL))


def test_last_value_skips_gaps() -> None:
    h = np.array([[1.0, 2.0, np.nan], [np.nan, np.nan, np.nan], [5.0, 6.0, 7.0]])
    out = last_value(h)
    assert out[0] == 2.0 and np.isnan(out[1]) and out[2] == 7.0


def test_backtest_periodic_series_beats_last_value() -> None:
    # A noiseless daily cycle: the periodic part knows what comes; last-value lags the climb.
    t = np.arange(3 * P)
    series = 40.0 + 30.0 * np.sin(2 * np.pi * t / P)
    res = backtest(series[None, :], ForecastPolicy(conservative=False), warmup_minutes=P)
    f, base = res["forecaster"], res["last_value"]
    assert f.intervals == base.intervals == (2 * P) // 15
    assert f.mae_vs_peak < 0.05 < base.mae_vs_peak
    assert f.shortfall_rate == base.shortfall_rate == 0.0


def test_simulated_trace_is_reproducible_and_daily() -> None:
    fam = ONLINE_FAMILIES["lm"]
    a = simulated_sm_trace(3 * P, fam, np.random.default_rng(1))
    b = simulated_sm_trace(3 * P, fam, np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    ok = np.isfinite(a)
    assert np.all((a[ok] >= 0) & (a[ok] <= 100)) and 0 < (~ok).sum() < 0.02 * a.size
    d1, d2 = a[:P], a[P : 2 * P]
    both = np.isfinite(d1) & np.isfinite(d2)
    assert np.corrcoef(d1[both], d2[both])[0, 1] > 0.8


@pytest.mark.parametrize("kwargs", [{"days": 0}, {"horizon_minutes": 0}, {"recent_quantile": 1.5},
                                    {"seasonal_quantile": -0.1}])
def test_invalid_policy(kwargs) -> None:
    with pytest.raises(ValueError):
        ForecastPolicy(**kwargs)


def test_forecast_to_sm_percentage() -> None:
    """Dynamic SM from the forecast: pct_off = clamp(floor(100 − forecast − headroom), min, max)."""
    h = flat_days(1, 30.0)
    h = np.concatenate([np.full(15, 30.0), h])
    h[15:30] = 37.5
    fc = forecast_next(h)
    assert fc == pytest.approx(37.5)
    assert int(offline_sm_pct(fc)) == 52
    assert int(offline_sm_pct(fc, SmPolicy(headroom_pct=0.0))) == 62
    assert int(offline_sm_pct(fc, SmPolicy(headroom_pct=0.0, max_pct=55))) == 55
    assert int(offline_sm_pct(95.0, SmPolicy(min_pct=20))) == 20
