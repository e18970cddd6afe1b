"""The co-location sampling plan: unseen job types first, never over budget, no point twice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.prediction.sampling_plan import PairCandidate, SamplingCost, plan_sampling

COST = SamplingCost(window_s=30, setup_s=20)  # windows of 50 s; point 100 s, baseline 150 s: k points cost 150 + 100 k


def cands(gpu="t4", services=("svc-a", "svc-b"), jobs=("A", "B", "C")):
    return [PairCandidate(gpu, s, j, 20.0) for s in services for j in jobs]


def test_unseen_job_types_come_first() -> None:
    measured = {("t4", "svc-a", "A"): {50: 4, 10: 1}, ("t4", "svc-b", "B"): {50: 2}}  # C never measured
    plan = plan_sampling(cands(), measured, budget_s=250, cost=COST)  # room for exactly one new run of 1 point
    assert [(r.job_type, r.sm_pcts, r.opens_job_type) for r in plan.runs] == [("C", (50,), True)]
    assert plan.runs[0].service == "svc-a"  # ties broken by name


def test_every_unseen_type_before_any_seen_pair_or_sweep() -> None:
    measured = {("t4", "svc-a", "A"): {50: 1}}
    plan = plan_sampling(cands(jobs=("A", "B", "C", "D")), measured, budget_s=10_000, cost=COST)
    first_types = [job for _g, _s, job, _sm in plan.order[:3]]
    assert sorted(first_types) == ["B", "C", "D"]
    # the first point of an unseen pair comes before any second point of a planned pair
    opened = {r.job_type for r in plan.runs if r.opens_job_type}
    assert opened == {"B", "C", "D"}


def test_a_pair_sweep_starts_in_the_middle_and_fills_the_widest_gaps() -> None:
    plan = plan_sampling([PairCandidate("a10", "s", "J", 50.0)], {}, budget_s=150 + 100 * 5, cost=COST)
    assert [sm for *_k, sm in plan.order] == [50, 10, 90, 30, 70]
    assert plan.runs[0].sm_pcts == (10, 30, 50, 70, 90) and plan.cost_s == 650


def test_measured_points_are_worth_less_than_new_ones() -> None:
    measured = {("t4", "s", "J"): {p: 3 for p in (10, 30, 50, 70, 90)}}
    plan = plan_sampling([PairCandidate("t4", "s", "J", 20.0)], measured, budget_s=150 + 100 * 4, cost=COST)
    assert plan.runs[0].sm_pcts == (20, 40, 60, 80)


def test_a_budget_too_small_for_one_run_plans_nothing() -> None:
    plan = plan_sampling(cands(), {}, budget_s=249, cost=COST)
    assert plan.runs == [] and plan.cost_s == 0
    assert plan_sampling([], {}, budget_s=1e6, cost=COST).runs == []


def test_gpu_types_are_planned_separately() -> None:
    measured = {("t4", "s", "J"): {50: 1}}
    plan = plan_sampling([PairCandidate("t4", "s", "J", 9.0), PairCandidate("a10", "s", "J", 9.0)], measured,
                         budget_s=250, cost=COST)
    assert [(r.gpu_type, r.opens_job_type) for r in plan.runs] == [("a10", True)]  # J is unseen on a10


def test_a_runs_cost_counts_every_window_the_harness_measures() -> None:
    """k points: k co-located windows, k + 1 solo windows of the service (before the first point, after each),
    2 of the job (before and after the sweep)."""
    cost = SamplingCost(window_s=30, setup_s=20)
    for k in (1, 2, 5):
        windows = k + (k + 1) + 2
        assert cost.baseline_s + k * cost.point_s == windows * (30 + 20)


@pytest.mark.parametrize("bad", [dict(budget_s=-1), dict(sm_grid=(0, 50)), dict(sm_grid=())])
def test_bad_input_is_refused(bad) -> None:
    kw = dict(candidates=cands(), measured={}, budget_s=100.0, cost=COST) | bad
    with pytest.raises(ValueError):
        plan_sampling(**kw)


_keys = st.tuples(st.sampled_from(["t4", "a10"]), st.sampled_from(["s1", "s2", "s3"]),
                  st.sampled_from(["J1", "J2", "J3", "J4"]))


@settings(max_examples=150, deadline=None)
@given(measured=st.dictionaries(_keys, st.dictionaries(st.sampled_from([10, 30, 50, 70, 90]),
                                                       st.integers(0, 5), max_size=5), max_size=10),
       budget=st.floats(0, 3000), window=st.floats(1, 60), setup=st.floats(0, 30))
def test_properties_budget_uniqueness_and_unseen_first(measured, budget, window, setup) -> None:
    cost = SamplingCost(window, setup)
    candidates = [PairCandidate(g, s, j, 10.0) for g in ("t4", "a10") for s in ("s1", "s2", "s3")
                  for j in ("J1", "J2", "J3", "J4")]
    plan = plan_sampling(candidates, measured, budget, cost)
    assert plan.cost_s <= budget + 1e-6
    assert len(set(plan.order)) == len(plan.order) == plan.points
    assert all(r.cost_s == pytest.approx(cost.baseline_s + cost.point_s * len(r.sm_pcts)) for r in plan.runs)
    seen = {(g, j) for (g, _s, j), v in measured.items() if any(n > 0 for n in v.values())}
    unseen_types = {(g, j) for g, _s, j in [(c.gpu_type, c.service, c.job_type) for c in candidates]} - seen
    # the first points chosen open unseen job types, as many as the budget allowed a run for
    opened = [(g, j) for g, _s, j, _sm in plan.order if (g, j) in unseen_types]
    first_of_each = []
    for gj in opened:
        if gj not in first_of_each:
            first_of_each.append(gj)
    assert [(g, j) for g, _s, j, _sm in plan.order[:len(first_of_each)]] == first_of_each
    if unseen_types and budget >= cost.baseline_s + cost.point_s:
        assert first_of_each, "an unseen job type fitted in the budget but was not planned first"
