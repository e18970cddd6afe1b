"""The burst guard: when a replica's rate is a burst, when it ends, and what the reference learns from."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_core.guard.burst import BurstGuard, BurstParams


def warmed(rates, n: int = 1, params: BurstParams = BurstParams()) -> BurstGuard:
    g = BurstGuard(n, params)
    for q in rates:
        g.update(q)
        g.record_minute(q)
    return g


def test_no_reference_no_guard_until_enough_minutes() -> None:
    g = BurstGuard(1, BurstParams(min_minutes=5))
    for _ in range(4):
        assert not g.update(10_000.0)[0]  # no reference: never a burst, however high
        g.record_minute(100.0)
    assert math.isnan(g.reference[0])
    g.update(100.0)
    g.record_minute(100.0)
    assert g.reference[0] == pytest.approx(100.0)
    assert g.update(121.0)[0] and not warmed([100.0] * 5).update(119.0)[0]  # margin 0.2: over 120


def test_a_burst_holds_until_the_rate_falls_under_half_the_margin_and_its_minutes_stay_out() -> None:
    rng = np.random.default_rng(0)
    base = 100.0 * (1.0 + 0.03 * rng.standard_normal(30))
    g = warmed(base)
    ref = g.reference[0]
    assert ref == pytest.approx(np.quantile(base, 0.9))
    # A 1.6x burst for 12 minutes: guarded the whole time, and the reference does not climb toward it.
    for _ in range(12):
        assert g.update(1.6 * ref)[0]
        g.record_minute(1.6 * ref)
        assert g.reference[0] <= base.max()  # the quiet minutes' level, not the burst's
    # Between the two thresholds (+10 % .. +20 %): still in the burst; under +10 %: over.
    assert g.update(1.15 * ref)[0]
    assert not g.update(1.05 * ref)[0]
    # A replica at +15 % that was not in a burst does not enter one.
    assert not warmed(base).update(1.15 * ref)[0]


def test_unknown_rates_keep_the_state_and_bad_minutes_are_not_learnt() -> None:
    g = warmed([100.0] * 10, n=2)
    assert list(g.update(np.array([200.0, 90.0]))) == [True, False]
    assert list(g.update(np.array([np.nan, np.nan]))) == [True, False]  # a missed scrape changes nothing
    assert list(g.update(None)) == [True, False]
    g.record_minute(np.array([np.inf, -5.0]))  # neither a rate: left out
    assert list(g.reference) == [pytest.approx(100.0), pytest.approx(100.0)]


def test_replicas_are_independent_and_a_guard_ends_when_its_reference_is_gone() -> None:
    p = BurstParams(window_minutes=6, min_minutes=3)
    g = warmed([np.array([50.0, 500.0])] * 6, n=2, params=p)
    assert list(g.update(np.array([61.0, 550.0]))) == [True, False]
    for _ in range(6):  # six minutes with no rate: the window empties, the reference goes, so does the guard
        g.update(np.array([np.nan, 500.0]))
        g.record_minute(np.array([np.nan, 500.0]))
    assert math.isnan(g.reference[0]) and list(g.update(np.array([np.nan, 500.0]))) == [False, False]


@pytest.mark.parametrize("kw", [{"window_minutes": 0}, {"min_minutes": 0}, {"min_minutes": 40},
                                {"quantile": 1.5}, {"margin": 0.0}, {"margin": float("nan")},
                                {"window_minutes": 2.5}])
def test_bad_parameters_are_refused(kw) -> None:
    with pytest.raises(ValueError, match="burst"):
        BurstParams(**kw)


def test_a_burst_begins_only_on_a_replica_over_its_limit_and_ends_on_the_rate() -> None:
    g = warmed([100.0] * 10, n=4)
    q = np.array([200.0, 200.0, 200.0, 200.0])
    # within its limit: no; over it: yes; not known: the rate alone decides
    assert list(g.update(q, np.array([False, True, np.nan, True]))) == [False, True, True, True]
    # once begun, a burst holds on the rate, however the latency falls with the job paused
    assert list(g.update(q, np.zeros(4))) == [False, True, True, True]
    assert list(g.update(np.array([105.0] * 4), np.zeros(4))) == [False] * 4
    assert list(warmed([100.0] * 10, n=2).update(np.array([200.0, 200.0]))) == [True, True]  # None: not known


def test_the_state_round_trips_through_json_and_a_foreign_one_starts_afresh() -> None:
    import json

    g = warmed([100.0, np.nan, 104.0] * 4, n=1)
    g.update(300.0)
    g.record_minute(300.0)
    again = BurstGuard.from_state(1, g.params, json.loads(json.dumps(g.to_state())))
    assert again.active.tolist() == [True] and again.reference[0] == pytest.approx(g.reference[0])
    for q in (310.0, 108.0, 104.0):  # both go on alike: the burst, its end, the next minutes
        assert again.update(q).tolist() == g.update(q).tolist()
        again.record_minute(q)
        g.record_minute(q)
        assert again.reference[0] == pytest.approx(g.reference[0])
    for bad in (None, {}, {"window": [[1.0]], "pos": 0, "active": [False], "in_minute": [False]},
                {**g.to_state(), "active": [True, True]}, {**g.to_state(), "pos": "x"}):
        fresh = BurstGuard.from_state(1, g.params, bad)
        assert math.isnan(fresh.reference[0]) and fresh.active.tolist() == [False]


def test_the_vectorized_quantile_is_numpys_nanquantile() -> None:
    import warnings

    from scheduler_core.guard.burst import nan_quantile_columns

    rng = np.random.default_rng(3)
    x = rng.gamma(2.0, 50.0, size=(30, 400))
    x[rng.random(x.shape) < 0.3] = np.nan
    x[:, 7] = np.nan  # a column with nothing
    x[:29, 8] = np.nan  # and one with a single value
    x[3, 9] = np.inf  # not a rate: left out as NaN is
    for q in (0.0, 0.5, 0.9, 1.0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanquantile(np.where(np.isfinite(x), x, np.nan), q, axis=0)
        np.testing.assert_allclose(nan_quantile_columns(x, q), want, rtol=1e-12, equal_nan=True)
