"""Why a round leaves a job unplaced (scheduler_core.jobs.unplaced), on hand-built rounds: one round per reason."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_core.domain import GpuHealth
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.round.plan import RoundConfig, plan_round
from scheduler_core.round.dense import dense_weights
from scheduler_core.jobs.unplaced import REASONS, groups
from tests.scheduler_core.round.test_plan import GIB, PREDICTORS, StubPredictor, gpu, job
from tests.scheduler_core.round.test_dense import SmoothStub, random_cluster


def unplaced(result) -> dict[int, tuple[str, str]]:
    return {j: (r, d) for r, d, ids in groups(result.stats["unplaced"]) for j in ids}


def reason(result, job_id: int) -> str:
    return unplaced(result)[job_id][0]


class OutOfRange(StubPredictor):
    """Declares a range no offline profile of the tests fits: every pair is refused."""

    accept_lo = np.full(16, -np.inf)
    accept_hi = np.full(16, np.inf)

    def __init__(self):
        super().__init__()
        self.accept_hi = self.accept_hi.copy()
        self.accept_hi[8] = 1.0  # the offline SM activity column (%) tops out at 1


def test_a_placed_round_explains_nothing() -> None:
    result = plan_round([gpu(1)], [job(10)], PREDICTORS)
    assert result.stats["unplaced"] == {"counts": {}, "jobs": {}}


def test_no_gpu_of_an_allowed_type_in_the_round() -> None:
    result = plan_round([gpu(1, gpu_type="t4")], [job(10, types=("a100",))], {**PREDICTORS, "a100": StubPredictor()})
    assert unplaced(result)[10] == ("no_gpu_of_allowed_type", "allows a100; the round has t4")


def test_no_predictor_for_the_allowed_type() -> None:
    result = plan_round([gpu(1, gpu_type="a10")], [job(10, types=("a10",))], {"t4": StubPredictor()})
    assert unplaced(result)[10] == ("no_predictor", "no promoted predictor for a10")


def test_no_profile_on_the_allowed_types() -> None:
    result = plan_round([gpu(1, gpu_type="t4"), gpu(2, gpu_type="a10")], [job(10, types=("t4", "a10"), profiles=())],
                        PREDICTORS)
    assert unplaced(result)[10] == ("no_profile", "no profile on a10, t4")


def test_gpus_that_are_not_healthy() -> None:
    gpus = [gpu(1, health=GpuHealth.OVERLIMIT), gpu(2, health=GpuHealth.INIT), gpu(3, health=GpuHealth.UNHEALTHY)]
    result = plan_round(gpus, [job(10, types=("t4",))], PREDICTORS)
    assert unplaced(result)[10] == ("gpu_not_healthy", "no Healthy GPU of t4 (they are Init, Overlimit, Unhealthy)")


def test_memory_above_every_candidates_quota() -> None:
    # quota: min(40 % of 16 GiB, free) = 6.4 GiB
    result = plan_round([gpu(1), gpu(2, gpu_type="a10")], [job(10, mem_bytes=7 * GIB, types=("t4",))], PREDICTORS)
    assert unplaced(result)[10] == (
        "memory", "needs 7 GiB; the largest offline memory quota on a Healthy GPU of t4 is 6.4 GiB")
    # the a10 GPU, which it does not allow, plays no part; 6 GiB fits the t4's quota
    assert [p.job_id for p in plan_round([gpu(1)], [job(10, mem_bytes=6 * GIB, types=("t4",))],
                                         PREDICTORS).placements] == [10]


def test_predicted_slowdown_over_the_allowance_at_every_share_level() -> None:
    # slowdown = 1 + 0.1·sm/100 ≥ 1.01 at the smallest share; an allowance of 0.005 admits none
    result = plan_round([gpu(1, allowance=0.005), gpu(2, allowance=0.005)], [job(10)], PREDICTORS)
    assert unplaced(result)[10] == (
        "slowdown", "predicted online slowdown over the service's allowance on all 2 candidate GPU(s) at every "
                    "share level")


def test_a_fallback_share_level_that_fits_is_not_a_slowdown() -> None:
    """At the dynamic share (70 %) the slowdown 1.07 is over 0.05; a smaller share level fits: placed."""
    result = plan_round([gpu(1, allowance=0.05)], [job(10)], PREDICTORS)
    assert [p.job_id for p in result.placements] == [10] and result.placements[0].sm_pct < 70


def test_no_throughput_where_the_slowdown_is_allowed() -> None:
    result = plan_round([gpu(1)], [job(10)], {"t4": StubPredictor(a=0.0), "a10": StubPredictor(a=0.0)})
    assert reason(result, 10) == "no_throughput"


def test_outside_the_predictors_range() -> None:
    result = plan_round([gpu(1)], [job(10, types=("t4",))], {"t4": OutOfRange()})
    assert reason(result, 10) == "out_of_predictor_range"
    assert "accepts none of 1 candidate pair(s)" in unplaced(result)[10][1]


def test_lost_in_the_matching() -> None:
    """Two jobs, one GPU: the one not chosen was feasible there."""
    result = plan_round([gpu(1)], [job(10), job(11)], PREDICTORS)
    [p] = result.placements
    other = 11 if p.job_id == 10 else 10
    assert unplaced(result)[other] == (
        "not_matched", "feasible on 1 GPU(s); the matching (the most predicted throughput in all) gave them to "
                       "other jobs")


def test_jobs_of_one_class_share_one_reason_and_counts_add_up() -> None:
    gpus = [gpu(1), gpu(2, health=GpuHealth.OVERLIMIT, gpu_type="a10")]
    jobs = [job(10), job(11), job(12), job(20, mem_bytes=9 * GIB), job(21, mem_bytes=9 * GIB),
            job(30, types=("a10",)), job(40, types=("v100",))]
    result = plan_round(gpus, jobs, {**PREDICTORS})
    got = result.stats["unplaced"]
    assert got["counts"] == {"no_gpu_of_allowed_type": 1, "gpu_not_healthy": 1, "memory": 2, "not_matched": 2}
    assert sum(got["counts"].values()) + len(result.placements) == len(jobs)
    assert list(got["counts"]) == [r for r in REASONS if r in got["counts"]]  # in cascade order
    assert list(got["jobs"]["memory"].values()) == ["20,21"]
    assert [(r, ids) for r, _d, ids in groups(got)][0] == ("no_gpu_of_allowed_type", [40])
    json.dumps(result.stats)  # stored with the round as JSON


def test_a_running_job_that_could_stay_is_not_matched_when_evicted() -> None:
    """A running job the plan evicts although it could have stayed: the matching chose another job."""
    gpus = [gpu(1, current_job_id=10, current_sm_pct=70)]
    result = plan_round(gpus, [job(10, current_gpu_id=1, current_sm_pct=70), job(11, mem_bytes=1 * GIB)],
                        {"t4": StubPredictor(), "a10": StubPredictor()})
    left = set(unplaced(result))
    assert len(left) == 1 and unplaced(result)[left.pop()][0] == "not_matched"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(0, 24), st.integers(1, 20), st.sampled_from([0, 2]))
def test_every_unplaced_job_has_one_reason_and_not_matched_means_feasible(seed, n, m, fallback_levels) -> None:
    """Against the every-pair reference: a job is "not matched" exactly when some pair of it is feasible."""
    gpus, jobs = random_cluster(seed, n, m)
    preds = {"t4": SmoothStub(seed), "a10": SmoothStub(seed + 1)}
    cfg = RoundConfig(sm=SmPolicy(fallback_levels=fallback_levels))
    result = plan_round(gpus, jobs, preds, cfg)
    why = unplaced(result)
    placed = {p.job_id for p in result.placements}
    assert set(why) == {j.job_id for j in jobs} - placed
    assert sum(result.stats["unplaced"]["counts"].values()) == len(why)
    _elig, _t, _s, feasible, _a, _pct, _q = dense_weights(gpus, jobs, preds, cfg)
    for j, job_ in enumerate(jobs):
        if job_.job_id in why:
            assert (why[job_.job_id][0] == "not_matched") == bool(feasible[:, j].any()), (job_, why[job_.job_id])
