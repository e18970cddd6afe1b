"""MuxFlow's allowance correction and budget pacing in the fleet simulator: rounds that tighten a service whose shared
p99 is over, and pace a budgeted one by what its requests spent."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from executors.data.calibration import SAMPLE_TRACE
from executors.simulated.evaluation import load_trace, simulation_catalog
from executors.simulated.profiling import offline_profile
from scheduler_core.online.budget_pacing import PacingParams
from scheduler_core.online.correction import CorrectionParams
from scheduler_core.simulator import SimConfig, SimInputs, get_policy, run_simulation
from scheduler_core.simulator.policies import _SharedMinutes

SMALL = dict(gpus=12, hours=4.0, jobs=60, arrival_hours=2.0, mean_job_hours=0.5, seed=3)
# The correction's tests: services on the flat +20 % rule (no budget), so every shared minute is planned at it.
FLAT = tuple(replace(sv, slowdown_budget=None, slowdown_allowance=0.2) for sv in SimConfig().services)


class LowStub:
    """A closed-form predictor (columns of scheduler_core.prediction.features.FEATURE_NAMES: 1 online SM, 9 offline
    SM, 15 the offline share) whose online slowdown is milder than the simulated cluster's interference."""

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        on_sm, off_sm, share = x[:, 1] / 100.0, x[:, 9] / 100.0, x[:, 15] / 100.0
        tput = np.clip(share * (1.0 - 0.5 * on_sm) * (0.7 + 0.3 * off_sm), 0.0, 1.0)
        return np.round(tput, 6), np.round(1.0 + 0.25 * share * (on_sm + off_sm), 6)


@pytest.fixture(scope="module")
def stub_inputs() -> SimInputs:
    catalog = simulation_catalog(SimConfig(gpus=1))
    return SimInputs(catalog, {(j, "t4"): offline_profile(catalog, j, "t4") for j in catalog.offline},
                     {"t4": LowStub()})


def _excess(metrics: dict) -> dict[str, float]:
    """Per service: how far its shared requests' mean slowdown went over its allowance (0: within; over the whole run
    the p99 is the first rounds', before the factor had its evidence)."""
    allow = {s.name: s.slowdown_allowance for s in FLAT}
    return {s["name"]: max(0.0, s["shared_avg_norm"] - 1.0 - allow[s["name"]]) for s in metrics["services"]}


class _Fleet:
    """What the policy's ring of minutes reads of a fleet: three GPUs, one per service, each declaring ``allowance``;
    GPU 0 shared at +30 %, GPU 1 alone, GPU 2 shared at +10 % (``slow``, which a test may change), 40 requests/s at
    8 ms alone each minute."""

    n, service_index = 3, np.array([0, 1, 2])

    def __init__(self, allowance: float) -> None:
        self.allowance = np.full(3, allowance)
        self.minutes_stepped = 0
        self.slow = np.array([1.3, np.nan, 1.1])

    def shared_minutes(self, since: int):  # slowdown, requests, latency alone (ms)
        k = self.minutes_stepped - since
        return np.tile(self.slow, (k, 1)), np.full((k, 3), 40.0), np.full((k, 3), 8.0)


def test_rounds_that_correct_the_allowance_keep_closer_to_it_than_rounds_that_trust_the_prediction(
        stub_inputs) -> None:
    trace = load_trace(SAMPLE_TRACE)
    muxflow = get_policy("muxflow")
    trusting = run_simulation(trace, stub_inputs, SimConfig(**SMALL, services=FLAT, allowance_correction=None),
                              muxflow).metrics
    correcting = run_simulation(trace, stub_inputs, SimConfig(**SMALL, services=FLAT), muxflow).metrics
    before, after = _excess(trusting), _excess(correcting)
    assert sum(before.values()) > 0.05  # the stub under-predicts: sharing goes over the allowance
    assert sum(after.values()) < 0.6 * sum(before.values())
    worst = max(before, key=before.get)
    assert after[worst] < before[worst]
    assert correcting["offline"]["finished"] > 0  # tighter, not closed


def test_the_policy_keeps_a_factor_per_service_that_tightens_while_over_and_relaxes_once_within(
        stub_inputs) -> None:
    # a window of one round's interval: each round's tail is that of the factor it placed under, as is (the fake
    # fleet below measures the same whatever the factor, so rebasing older minutes would only blur the steps)
    cfg = SimConfig(**{**SMALL, "gpus": 3, "hours": 1.0}, services=FLAT,
                    allowance_correction=CorrectionParams(min_minutes=5, window_minutes=15))
    planner = get_policy("muxflow").make_planner(cfg, stub_inputs)
    ring = planner.correction
    assert isinstance(ring, _SharedMinutes)

    fleet, names, gain = _Fleet(0.2), [sv.name for sv in cfg.services], cfg.allowance_correction.gain

    def round_(minutes: int) -> np.ndarray:
        fleet.minutes_stepped += minutes
        ring.take(fleet)
        return ring.corrected(fleet, np.full(3, 0.2))

    allow = round_(15)
    assert ring.factors[names[0]].tail == pytest.approx(1.5)  # its p99 at 1.5× its allowance
    assert ring.factors[names[0]].factor == pytest.approx(1.5 ** gain)
    assert ring.factors[names[1]].minutes == 0 and ring.factors[names[1]].factor == 1.0  # no shared minute
    assert ring.factors[names[2]].factor == 1.0  # within: as declared
    assert allow == pytest.approx([0.2 / 1.5 ** gain, 0.2, 0.2])
    round_(15)  # still over: tighter again
    assert ring.factors[names[0]].factor == pytest.approx(1.5 ** (2 * gain))
    fleet.slow = np.array([1.1, np.nan, 1.1])  # within now (half its allowance): it relaxes back to 1, not past
    factors = []
    for _ in range(3):
        round_(15)
        factors.append(ring.factors[names[0]].factor)
    assert factors[0] < 1.5 and factors == sorted(factors, reverse=True) and factors[-1] == 1.0
    assert round_(15) == pytest.approx([0.2, 0.2, 0.2])


def test_the_policy_paces_each_budgeted_service_by_what_its_requests_spent_over_the_window(stub_inputs) -> None:
    services = tuple(replace(sv, slowdown_allowance=0.3, slowdown_budget=0.1) for sv in SimConfig().services)
    cfg = SimConfig(**{**SMALL, "gpus": 3, "hours": 1.0}, services=services, allowance_correction=None,
                    budget_pacing=PacingParams(min_minutes=5, window_minutes=30))
    planner = get_policy("muxflow").make_planner(cfg, stub_inputs)
    ring = planner.correction
    assert isinstance(ring, _SharedMinutes)  # kept for the pacing alone

    fleet, names = _Fleet(0.3), [sv.name for sv in services]
    budgets = {name: 0.1 for name in names}

    def round_(minutes: int) -> dict:
        fleet.minutes_stepped += minutes
        ring.take(fleet)
        return ring.paced(fleet, budgets)

    got = round_(15)
    # over its aim (a share of its budget) 3 / aim ×: k = (aim / 3)^0.5; spent nothing: planned at its cap; spent
    # its budget: a little under it
    aim = cfg.budget_pacing.setpoint
    k0 = (aim / 3) ** 0.5
    assert ring.paces[names[0]] == pytest.approx(k0) and ring.paces[names[1]] == pytest.approx(3.0)
    assert ring.paces[names[2]] == pytest.approx(aim ** 0.5)
    assert got == pytest.approx({names[0]: 0.1 * k0, names[1]: 0.3, names[2]: 0.1 * aim ** 0.5})
    # Still +30 %: the minutes planned under k = 1 count as they were spent (+30 %), so k falls again.
    round_(15)
    assert ring.paces[names[0]] == pytest.approx(k0 * k0)
    # Now within its budget (+5 %): while +30 % minutes are in the window it still falls (what was spent stays
    # spent), then it loosens round after round, each minute of the lower k counted at the k now in force.
    fleet.slow = np.array([1.05, np.nan, 1.1])
    round_(15)
    assert ring.paces[names[0]] == pytest.approx(max(cfg.budget_pacing.floor,
                                                     k0 * k0 * (aim * 0.1 / ((0.3 + 0.05) / 2)) ** 0.5))
    ks = []
    for _ in range(4):
        round_(15)
        ks.append(ring.paces[names[0]])
    assert ks == sorted(ks) and ks[0] > cfg.budget_pacing.floor and ks[-1] > 2 * ks[0]
