"""The slowdown budget's water level and allowances: known answers and the budget they keep."""

import numpy as np
import pytest

from scheduler_core.online.latency_budget import allowances, budget_allowances, request_weights, water_levels
from scheduler_core.online.latency_model import LatencyCurve


def test_water_level_known_answer():
    # Weights 1, 1, 8 with cap 0.5 and budget 0.2: the two quiet minutes take the cap (spend 0.5 each),
    # the busy one what is left: 0.2 * 10 - 1 = 1.0, i.e. an allowance of 1/8.
    lv = water_levels(np.array([[1.0, 1.0, 8.0]]), 0.2, 0.5)
    assert lv[0] == pytest.approx(1.0)
    a = allowances(np.array([1.0, 8.0]), np.array([lv[0], lv[0]]), 0.2, 0.5)
    assert a == pytest.approx([0.5, 0.125])


@pytest.mark.parametrize("seed", range(5))
def test_replaying_the_day_meets_the_budget_exactly(seed):
    rng = np.random.default_rng(seed)
    w = rng.gamma(2.0, 10.0, size=(4, 300))
    budget, cap = np.array([0.05, 0.1, 0.15, 0.19]), 0.2
    lv = water_levels(w, budget, cap)
    a = allowances(w, np.repeat(lv[:, None], w.shape[1], axis=1), budget[:, None], cap)
    assert np.all(a <= cap + 1e-12)
    assert (w * a).sum(axis=1) / w.sum(axis=1) == pytest.approx(budget)
    # Busier minutes never get more than quieter ones.
    order = np.argsort(w, axis=1)
    assert np.all(np.diff(np.take_along_axis(a, order, axis=1), axis=1) <= 1e-12)


def test_budget_at_or_over_the_cap_is_the_flat_allowance():
    w = np.array([[1.0, 5.0, 9.0]])
    assert np.isinf(water_levels(w, 0.2, 0.2)[0]) and np.isinf(water_levels(w, 0.3, 0.2)[0])
    assert budget_allowances(np.array([[10.0, 50.0, 90.0]]), [90.0], 0.3, 0.2)[0] == pytest.approx(0.2)


def test_no_budget_no_history_and_no_load():
    hist = np.array([[np.nan, np.nan], [0.0, 0.0], [10.0, 30.0], [10.0, 30.0]])
    fc = np.array([20.0, 20.0, 0.0, np.nan])
    a = budget_allowances(hist, fc, 0.1, 0.3)
    # No history / an idle history: the budget itself; nothing forecast to slow: the cap; unknown forecast: budget.
    assert a == pytest.approx([0.1, 0.1, 0.3, 0.1])
    # A replica with no minutes at all yet: the budget.
    assert budget_allowances(np.zeros((2, 0)), [10.0, 20.0], 0.1, 0.3) == pytest.approx([0.1, 0.1])
    # A NaN budget: the cap, flat.
    assert budget_allowances(hist[2:3], [30.0], np.nan, 0.25)[0] == pytest.approx(0.25)


def test_latency_curve_weighs_each_minute_by_its_latency():
    hist = np.array([[10.0] * 10 + [60.0] * 10])
    # Requests alone: the quiet minutes spend 10 x 0.3 x 10 of the 0.1 x 700 budget, the busy ones
    # share the other 40: 4 / 60 each.
    assert budget_allowances(hist, [60.0], 0.1, 0.3)[0] == pytest.approx(4.0 / 60.0)
    # Latency alone doubles from 10 % to 60 % SM: the busy minutes hold more of the weight (600 vs 50),
    # so the quiet minutes' cap costs them less: (650 - 150) / 10 = 50 per minute, 50 / 600 each.
    curve = LatencyCurve(np.array([10.0, 60.0]), np.array([5.0, 10.0]), 0.0)
    assert budget_allowances(hist, [60.0], 0.1, 0.3, curve)[0] == pytest.approx(50.0 / 600.0)
    assert request_weights([np.nan, -1.0, 20.0]) == pytest.approx([0.0, 0.0, 20.0])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="budgets and caps"):
        water_levels(np.ones((1, 3)), -0.1, 0.2)
    with pytest.raises(ValueError, match="histories for"):
        budget_allowances(np.ones((2, 3)), [1.0], 0.1, 0.2)
