"""The allowance correction: a per-service controller on the shared minutes' p99 against the allowance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_core.online.correction import (
    NO_CORRECTION,
    CorrectionParams,
    corrected_allowance,
    tail,
    update,
)

P = CorrectionParams(min_minutes=10)


def _minutes(n: int, measured: float, allowance: float = 0.2, qps: float = 50.0, age: float = 0.0):
    return [measured] * n, [allowance] * n, [qps] * n, [age] * n


def _cat(*parts):
    return tuple(sum((list(p[i]) for p in parts), []) for i in range(4))


def test_the_tail_is_the_request_weighted_p99_of_the_minutes_against_their_allowance() -> None:
    e, n = tail(*_minutes(100, 1.25), P)
    assert n == 100 and e == pytest.approx(1.25)  # +25 % against +20 %: a quarter over
    # 98 % of the requests at +10 %, 2 % at +30 %: the p99 is +30 %
    e, _ = tail(*_cat(_minutes(98, 1.10), _minutes(2, 1.30)), P)
    assert e == pytest.approx(1.5)
    # the same minutes, the slow ones with few requests: under 1 % of the requests, the p99 is +10 %
    e, _ = tail(*_cat(_minutes(98, 1.10, qps=100.0), _minutes(2, 1.30, qps=1.0)), P)
    assert e == pytest.approx(0.5)
    # each minute against its own allowance (a budget-shaped one, or services of different allowances)
    e, _ = tail(*_cat(_minutes(50, 1.10, allowance=0.1), _minutes(50, 1.10, allowance=0.4)), P)
    assert e == pytest.approx(1.0)
    assert tail([1.3] * 20, 0.2, [1.0] * 20, [0.0] * 20, P)[0] == pytest.approx(1.5)  # a scalar allowance


def test_a_service_over_its_allowance_is_tightened_round_after_round_until_within() -> None:
    # A proportional plant: the measured tail increase scales with the allowance the rounds admit, 1.5× too much.
    c, history = 1.0, []
    for _ in range(12):
        measured = 1.0 + 1.5 * 0.2 / c
        got = update(c, *_minutes(60, measured), P)
        assert got.factor >= c  # only ever tighter while over
        c = got.factor
        history.append(measured)
    assert history[0] == pytest.approx(1.30)
    assert all(b <= a for a, b in zip(history, history[1:]))
    assert history[-1] - 1.0 < 0.2 * 1.01 and c == pytest.approx(1.5, rel=0.01)
    assert corrected_allowance(0.2, c) == pytest.approx(0.2 / c)
    # the step is E^gain: gain 1 cancels the excess at once on this plant
    assert update(1.0, *_minutes(60, 1.30), CorrectionParams(min_minutes=10, gain=1.0)).factor == pytest.approx(1.5)
    assert update(1.0, *_minutes(60, 1.30), P).factor == pytest.approx(1.5 ** 0.5)


def test_minutes_placed_under_an_older_factor_are_rebased_to_the_factor_now_in_force() -> None:
    # an hour at c = 1 measuring +30 %, then an hour at c = 1.5 measuring +20 % (the plant answered in proportion)
    loose, tight = _minutes(60, 1.30, age=90.0), _minutes(60, 1.20, age=30.0)
    minutes, in_force = _cat(loose, tight), [1.0] * 60 + [1.5] * 60
    assert tail(*minutes, P)[0] == pytest.approx(1.5)  # as they are: the loose hour's tail, over
    c = update(1.5, *minutes, P, in_force=in_force)  # rebased: both hours within at 1.5, no further tightening
    assert c.tail == pytest.approx(1.0) and c.factor == pytest.approx(1.5)
    assert update(1.5, *minutes, P).factor == pytest.approx(1.5 * 1.5 ** 0.5)  # without: windup
    # an unknown factor (None, NaN) counts as the one now in force
    assert update(1.5, *minutes, P, in_force=[None] * 60 + [1.5] * 60).factor == pytest.approx(1.5 * 1.5 ** 0.5)
    assert update(1.5, *minutes, P, in_force=1.5).factor == pytest.approx(1.5 * 1.5 ** 0.5)


def test_a_service_within_its_allowance_keeps_the_allowance_as_declared() -> None:
    for measured in (1.0, 1.05, 1.19, 1.20, 0.97):
        c = update(1.0, *_minutes(60, measured), P)
        assert c.factor == 1.0 and not c.active
    assert update(None, *_minutes(60, 1.1), P).factor == 1.0


def test_a_tightened_service_relaxes_back_toward_one_once_within_and_never_below() -> None:
    c = update(2.0, *_minutes(60, 1.05), P)  # E = 0.25: relax by 0.25^0.5 = 0.5
    assert c.factor == pytest.approx(1.0) and c.tail == pytest.approx(0.25)
    c = update(2.0, *_minutes(60, 1.16), P)  # E = 0.8: a step back toward 1
    assert 1.0 < c.factor < 2.0 and c.factor == pytest.approx(2.0 * 0.8 ** 0.5)
    assert update(1.5, *_minutes(60, 0.99), P).factor == 1.0  # faster than alone: fully relaxed, not past 1


def test_the_factor_is_bounded() -> None:
    assert update(3.5, *_minutes(60, 2.0), P).factor == 4.0  # the cap
    assert update(1.0, *_minutes(60, 1.8), CorrectionParams(min_minutes=10, cap=2.0, gain=1.0)).factor == 2.0
    assert update(9.0, *_minutes(5, 1.1), P).factor == 4.0  # a stored factor out of bounds is clipped
    assert update(0.5, *_minutes(5, 1.1), P).factor == 1.0


def test_too_few_minutes_leave_the_factor_as_it_is() -> None:
    params = CorrectionParams(min_minutes=30)
    c = update(1.7, *_minutes(29, 1.5), params)
    assert c.factor == 1.7 and c.minutes == 29 and c.tail is None
    assert update(1.7, *_minutes(30, 1.5), params).factor > 1.7
    assert update(None, [], [], [], []) == NO_CORRECTION
    assert corrected_allowance(0.2, NO_CORRECTION) == 0.2


def test_nan_inf_none_zero_allowances_and_minutes_without_requests_are_left_out() -> None:
    good = _minutes(60, 1.3)
    bad = ([math.nan, math.inf, None, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, -math.inf],
           [0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.0, math.nan, None, 0.2],
           [50.0, 50.0, 50.0, 0.0, None, -3.0, 50.0, 50.0, 50.0, 50.0],
           [0.0] * 10)
    e, n = tail(*_cat(good, bad), P)
    assert n == 60 and e == pytest.approx(1.5)
    assert tail(np.array([1.3, np.nan]), np.array([0.2, 0.2]), np.ones(2), np.zeros(2),
                CorrectionParams(min_minutes=1))[1] == 1
    for previous in (math.nan, math.inf, None, -1.0, "x"):
        assert update(previous, *_minutes(60, 1.1), P).factor == 1.0


def test_minutes_outside_the_window_are_ignored_and_a_half_life_weighs_older_ones_less() -> None:
    params = CorrectionParams(window_minutes=90, min_minutes=10)
    recent = _minutes(60, 1.1, age=5.0)
    stale = _minutes(600, 1.6, age=90.0)  # badly over, but outside the window: the factor in force then is gone
    e, n = tail(*_cat(recent, stale), params)
    assert n == 60 and e == pytest.approx(0.5)
    assert tail(*_cat(recent, _minutes(60, 1.6, age=-1.0)), params)[1] == 60  # after the round: not evidence
    # inside the window, with a half-life: 3 % of the weight at +60 % from an hour ago sits above the p99 ...
    older = _minutes(3, 1.6, age=60.0)
    assert tail(*_cat(recent, older), params)[0] == pytest.approx(3.0)  # flat: 3 of 63 minutes
    halved = CorrectionParams(window_minutes=90, min_minutes=10, half_life_minutes=10.0)
    assert tail(*_cat(recent, older), halved)[0] == pytest.approx(0.5)  # ... weighing 1/64 each: below it


def test_a_negative_allowance_stays_closed() -> None:
    assert corrected_allowance(-0.1, 2.0) == -0.1 and corrected_allowance(0.0, 2.0) == 0.0


@pytest.mark.parametrize("bad", [
    dict(window_minutes=0), dict(window_minutes=1.5), dict(half_life_minutes=0.0), dict(half_life_minutes=math.inf),
    dict(min_minutes=0), dict(min_minutes=True), dict(cap=0.9), dict(cap=math.inf), dict(cap=math.nan),
    dict(quantile=0.0), dict(quantile=1.0), dict(quantile=math.nan), dict(quantile=None),
    dict(gain=0.0), dict(gain=1.5), dict(gain=math.nan),
])
def test_bad_parameters_are_refused_with_a_clear_error(bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
        CorrectionParams(**bad)


def test_misaligned_inputs_and_bad_factors_are_refused() -> None:
    with pytest.raises(ValueError, match="aligned"):
        tail([1.2, 1.3], [0.2], [1.0, 1.0], [0.0, 0.0])
    with pytest.raises(ValueError, match="factor"):
        corrected_allowance(0.2, 0.0)
