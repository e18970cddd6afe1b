"""Budget pacing: a budgeted service's planned budget follows what its requests spent over the last day."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler_core.online.budget_pacing import PacingParams, paced_budget, spent, step
from scheduler_core.online.latency_budget import allowances, water_levels

P = PacingParams(min_minutes=10)
AIM = P.setpoint  # the fraction of the budget the pacing aims at


def test_spent_weighs_every_minute_by_its_requests_and_an_unshared_one_spends_nothing() -> None:
    # two minutes shared at +20 % (weight 1 each), two unshared (NaN) with weight 2 each: 0.4 / 6
    s, n = spent([1.2, 1.2, np.nan, np.nan], [1, 1, 2, 2])
    assert n == 4 and s == pytest.approx(0.4 / 6)
    # a minute faster than alone spends nothing (not less); minutes without a usable weight do not count
    s, n = spent([0.9, 1.1, 5.0, 5.0, 5.0], [1, 1, 0, np.nan, -1])
    assert n == 2 and s == pytest.approx(0.05)
    # planned under a lower k than now's: counted at now's (× 2); under a higher one: as it was spent
    s, _ = spent([1.1, 1.1], [1, 1], k_then=[1.0, 4.0], k_now=2.0)
    assert s == pytest.approx((0.2 + 0.1) / 2)
    s, _ = spent([1.1, 1.1], [1, 1], k_then=[np.nan, 0.0], k_now=2.0)  # unknown: as now's
    assert s == pytest.approx(0.1)
    assert spent([], []) == (None, 0)
    with pytest.raises(ValueError):
        spent([1.0, 1.0], [1.0])


def test_headroom_plans_at_the_cap_and_nothing_to_pace_is_left_alone() -> None:
    # nothing spent (no minute shared): at the cap at once
    assert step(1.0, 0.0, 100, 0.1, 0.3, P) == pytest.approx(3.0)
    assert paced_budget(0.1, 0.3, 3.0) == pytest.approx(0.3)
    # a spend far under the budget walks up to the cap and stops there
    k = 1.0
    for _ in range(10):
        k = step(k, 0.001, 100, 0.1, 0.3, P)
    assert k == pytest.approx(3.0)
    # no budget below the cap: nothing to pace
    assert step(2.0, 0.5, 100, 0.3, 0.3, P) == 1.0
    assert paced_budget(None, 0.3, 2.0) is None and paced_budget(0.3, 0.3, 2.0) == 0.3
    # too few minutes, or none: k as it was (clipped to its range); a bad stored k is 1
    assert step(1.7, 0.5, 9, 0.1, 0.3, P) == 1.7
    assert step(1.7, None, 0, 0.1, 0.3, P) == 1.7
    assert step(9.0, None, 0, 0.1, 0.3, P) == pytest.approx(3.0)
    for bad in (math.nan, -1.0, math.inf):
        assert step(bad, None, 0, 0.1, 0.3, P) == 1.0
    for bad in (math.nan, -1.0, math.inf, None):
        assert paced_budget(0.1, 0.3, bad) == pytest.approx(0.1)
    # no k on record and nothing to tell yet (a new service): it has spent nothing, so it starts at its cap; with
    # evidence it steps from the declared budget
    assert step(None, None, 0, 0.1, 0.3, P) == pytest.approx(3.0)
    assert step(None, 0.5, 9, 0.1, 0.3, P) == pytest.approx(3.0)
    assert step(None, 0.1 * AIM, 100, 0.1, 0.3, P) == pytest.approx(1.0)


def test_a_step_moves_k_by_half_the_log_error_within_the_floor_and_the_cap() -> None:
    # spent twice its aim: k × 0.5^0.5
    assert step(1.0, 0.2 * AIM, 100, 0.1, 0.3, P) == pytest.approx(0.5 ** 0.5)
    # spent a quarter of it: k × 2, capped at cap / budget = 3
    assert step(1.2, 0.025 * AIM, 100, 0.1, 0.3, P) == pytest.approx(2.4)
    assert step(2.0, 0.025 * AIM, 100, 0.1, 0.3, P) == pytest.approx(3.0)
    # the budget itself is over the aim: a service spending exactly its budget is tightened a little
    assert step(1.0, 0.1, 100, 0.1, 0.3, P) == pytest.approx(AIM ** 0.5)
    # never under the floor, however much it overspent
    assert step(0.3, 10.0, 100, 0.1, 0.3, P) == pytest.approx(P.floor)


def _days(share: float, pace: bool, days: int = 3, rebase: bool = True) -> tuple[float, float, list[float]]:
    """A plant: a replica's daily cycle of requests, each minute shared with probability ``share`` and then slowed
    by 70 % of the allowance the budget's water level gives it (a cautious predictor). Every interval the round
    plans with the paced budget (or the declared one), and every round steps k on the last day's minutes. Returns
    the last day's spend, the final k and the k of each round of the last day (``days`` days: the first ones
    settle k); ``rebase=False`` counts every minute as it was spent."""
    budget, cap = 0.1, 0.3
    day = 24 * 60
    sm = 40.0 + 30.0 * np.sin(2 * np.pi * np.arange(day) / day)  # the replica's load, as its monitors report it
    load = np.tile(sm, days)
    shared = np.random.default_rng(0).random(days * day) < share
    slow = np.full(days * day, np.nan)
    k_then = np.ones(days * day)
    k, ks = 1.0, []
    for start in range(0, days * day, 15):
        planned = paced_budget(budget, cap, k)
        level = water_levels(sm[None, :], planned, cap)[0]  # the replica's last day, replayed
        a = allowances(load[start:start + 15], level, planned, cap)
        slow[start:start + 15] = np.where(shared[start:start + 15], 1.0 + 0.7 * a, np.nan)
        k_then[start:start + 15] = k
        past = slice(max(0, start + 15 - day), start + 15)
        s, n = spent(slow[past], load[past], k_then[past] if rebase else None, k)
        k = step(k, s, n, budget, cap, P) if pace else 1.0
        ks.append(k)
    return spent(slow[-day:], sm)[0], k, ks[-day // 15:]


@pytest.mark.parametrize("share", [0.1, 0.3, 0.6, 1.0])
def test_a_service_spends_its_budget_whatever_part_of_it_is_shared(share: float) -> None:
    budget, cap = 0.1, 0.3
    got, k, ks = _days(share, pace=True)
    reach = 0.7 * share * cap  # the most a day can spend: every shared minute at the cap
    if reach > budget:
        assert got == pytest.approx(AIM * budget, rel=0.03) and got <= budget
    else:  # headroom: planned at the cap, and the budget is out of reach
        assert k == pytest.approx(cap / budget) and got == pytest.approx(reach, rel=0.05)
    if reach > budget:  # settling: k moves by a tenth or so over the third day
        assert max(ks) / min(ks) < 1.25
        # Without the one-sided rebasing the day's window answers too late: k swings over a day by 3× or more.
        _, _, swung = _days(share, pace=True, rebase=False)
        assert max(swung) / min(swung) > 3.0
    # Planned at the declared budget, the same service spends 0.7 × share of it: under it with headroom, and under
    # it even when every minute is shared (the predictor's caution).
    unpaced, _, _ = _days(share, pace=False)
    assert unpaced == pytest.approx(0.7 * share * budget, rel=0.1)


def test_the_parameters_are_checked() -> None:
    for bad in (dict(gain=0.0), dict(gain=1.5), dict(floor=0.0), dict(floor=2.0), dict(min_minutes=0),
                dict(window_minutes=0), dict(setpoint=0.0), dict(setpoint=1.1)):
        with pytest.raises(ValueError):
            PacingParams(**bad)
