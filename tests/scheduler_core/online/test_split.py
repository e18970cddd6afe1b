"""The online split estimated from the request rate: the fitted curve, its ends, and which minutes it fills."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_core.online.split import SplitFitConfig, fill_split_gaps, fit_curve, fit_split


def test_a_proportional_split_is_recovered_inside_and_beyond_the_fitted_range() -> None:
    rng = np.random.default_rng(0)
    qps = rng.uniform(10.0, 60.0, 400)
    curve = fit_curve(qps, 0.5 * qps)
    assert curve is not None
    assert np.all(np.diff(curve.qps) > 0) and np.all(np.diff(curve.value) >= 0)
    inside = np.linspace(15.0, 55.0, 9)
    assert np.allclose(curve.at(inside), 0.5 * inside, rtol=0.03)
    # Above the highest bin: in proportion to the rate (SM activity follows requests), capped at 100 %.
    assert curve.at(100.0) == pytest.approx(50.0, rel=0.03)
    assert curve.at(1e6) == 100.0
    # Below the lowest: flat at the lowest bin's value (an overestimate, the safe side).
    assert curve.at(0.0) == pytest.approx(curve.value[0])
    assert curve.at(0.0) > 0.5 * qps.min()


def test_the_curve_never_falls_with_more_requests_and_keeps_the_median() -> None:
    rng = np.random.default_rng(1)
    qps = np.repeat(np.arange(1.0, 13.0), 20)
    value = 3.0 * qps + rng.normal(0.0, 1.0, qps.size)
    value[qps == 6.0] = 2.0  # a dip: six requests/s cannot need less than five
    value[qps == 9.0] += np.r_[[500.0] * 3, [0.0] * 17]  # a few outliers in a bin: the median ignores them
    curve = fit_curve(qps, value, SplitFitConfig(bins=12))
    assert np.all(np.diff(curve.value) >= 0)
    assert curve.at(6.0) >= curve.at(5.0)
    assert curve.at(9.0) == pytest.approx(27.0, abs=1.0)


def test_too_few_or_unusable_minutes_give_no_curve() -> None:
    assert fit_curve(np.arange(10.0), np.arange(10.0)) is None  # under min_points
    assert fit_curve(np.full(100, 20.0), np.full(100, 10.0)) is None  # one rate: no shape to fit
    nan = np.full(100, np.nan)
    assert fit_curve(np.arange(100.0), nan) is None
    assert fit_curve(-np.arange(1.0, 101.0), np.arange(100.0)) is None  # negative rates are skipped
    with pytest.raises(ValueError, match="request rates for"):
        fit_curve(np.arange(5.0), np.arange(6.0))
    with pytest.raises(ValueError, match="min_bins"):
        SplitFitConfig(bins=2, min_bins=3)


def test_fill_takes_the_gaps_with_a_known_rate_only_and_leaves_the_input_alone() -> None:
    qps = np.r_[np.linspace(10.0, 60.0, 100), [40.0, np.nan, 80.0]]
    sm = np.r_[0.5 * qps[:100], [np.nan, np.nan, 33.0]]
    util = np.r_[0.6 * qps[:100], [np.nan, np.nan, np.nan]]
    bw = np.full(103, np.nan)  # never split: no curve, stays a gap
    series = {"qps": qps, "sm": sm, "gpu_util": util, "bw": bw, "mem": np.full(103, 2e9)}
    curves = fit_split([series])
    assert set(curves) == {"sm", "gpu_util"}
    out, filled = fill_split_gaps(series, curves)
    assert out["sm"][100] == pytest.approx(20.0, rel=0.03)  # a gap with a rate: estimated
    assert np.isnan(out["sm"][101])  # a gap without a rate stays a gap
    assert out["sm"][102] == 33.0  # a measured minute is never overwritten
    assert out["gpu_util"][102] == pytest.approx(48.0, rel=0.03)
    assert np.isnan(out["bw"]).all()
    assert filled.tolist() == [False] * 100 + [True, False, False]
    assert np.isnan(series["sm"][100])  # the caller's arrays are not changed
    assert fit_split([]) == {}


def test_a_large_pool_is_thinned_evenly_and_fits_the_same_curve() -> None:
    rng = np.random.default_rng(2)
    replicas = []
    for _ in range(40):
        q = rng.uniform(5.0, 80.0, 500)
        sm = 0.4 * q
        sm[rng.random(500) < 0.3] = np.nan  # shared minutes: no split
        replicas.append({"qps": q, "sm": sm, "gpu_util": sm, "bw": sm})
    full = fit_split(replicas, SplitFitConfig(max_points=10**9))["sm"]
    thin = fit_split(replicas, SplitFitConfig(max_points=1_000))["sm"]
    probe = np.linspace(10.0, 120.0, 12)
    assert np.allclose(thin.at(probe), full.at(probe), rtol=0.03)
    assert np.allclose(thin.at(probe), np.minimum(100.0, 0.4 * probe), rtol=0.05)
    with pytest.raises(ValueError, match="max_points"):
        SplitFitConfig(min_points=50, max_points=40)
