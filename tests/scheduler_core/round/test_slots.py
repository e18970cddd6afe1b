"""Several offline jobs per GPU (scheduler_core.round.slots): how many slots, their shares, quotas and budget.

The round with ``max_jobs_per_gpu`` > 1 against the dense reference (every slot × job
pair predicted, Kuhn–Munkres): the same optimum, certified, and every GPU within its
slots, its offline share and its memory quota.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_core.domain import Action, GpuHealth
from scheduler_core.online.dynamic_sm import SmPolicy, offline_sm_pct
from scheduler_core.round.weights import mem_quota_bytes
from scheduler_core.round.check import plan_violations
from scheduler_core.round.plan import RoundConfig, plan_round
from scheduler_core.round.dense import plan_round_dense
from scheduler_core.round.slots import SlotLayout, keeps_share, slot_counts, slot_shares
from tests.scheduler_core.round.test_plan import GIB, PREDICTORS, StubPredictor, gpu, job
from tests.scheduler_core.round.test_dense import SmoothStub, random_cluster


def test_one_slot_per_gpu_while_every_job_has_a_gpu() -> None:
    gpus = [gpu(i, forecast_sm_pct=20.0) for i in range(1, 4)]
    jobs = [job(10 + j) for j in range(3)]
    cfg = RoundConfig(max_jobs_per_gpu=3)
    assert slot_counts(gpus, jobs, np.array([70, 70, 70]), np.full(3, 8 * GIB), cfg).tolist() == [1, 1, 1]


def test_gpus_with_the_largest_offline_share_are_split_first_and_just_enough() -> None:
    gpus = [gpu(i, forecast_sm_pct=fc) for i, fc in zip(range(1, 5), (60.0, 10.0, 30.0, 20.0))]
    jobs = [job(10 + j) for j in range(6)]  # two more jobs than GPUs
    cfg = RoundConfig(max_jobs_per_gpu=2)
    share = offline_sm_pct(np.array([g.forecast_sm_pct for g in gpus]), cfg.sm)  # 30, 80, 60, 70
    counts = slot_counts(gpus, jobs, share, np.full(4, 8 * GIB), cfg)
    assert counts.tolist() == [1, 2, 1, 2]
    # Three jobs per GPU where the share allows three slots of at least min_pct.
    counts = slot_counts(gpus, jobs, share, np.full(4, 8 * GIB), RoundConfig(max_jobs_per_gpu=3))
    assert counts.tolist() == [1, 3, 1, 1]
    assert slot_counts(gpus, jobs, np.array([15, 15, 15, 15]), np.full(4, 8 * GIB), cfg).tolist() == [1, 1, 1, 1]


def test_jobs_running_together_keep_their_slots() -> None:
    gpus = [gpu(1, forecast_sm_pct=20.0), gpu(2, forecast_sm_pct=20.0)]
    jobs = [job(10, current_gpu_id=1, current_sm_pct=35), job(11, current_gpu_id=1, current_sm_pct=35)]
    counts = slot_counts(gpus, jobs, np.array([70, 70]), np.full(2, 8 * GIB), RoundConfig(max_jobs_per_gpu=2))
    assert counts.tolist() == [2, 1]


def test_a_split_gpu_shares_its_offline_share_and_predicts_slowdown_at_the_whole() -> None:
    levels = np.array([[70, 40], [55, 25]])
    tput, slow = slot_shares(levels, SlotLayout.of(np.array([2, 1])), min_pct=10)
    assert tput.tolist() == [[35, 35, 40], [-1, -1, 25]]
    assert slow.tolist() == [[70, 70, 40], [-1, -1, 25]]
    tput, _ = slot_shares(np.array([[15]]), SlotLayout.of(np.array([2])), min_pct=10)
    assert tput.tolist() == [[-1, -1]]  # 7 % each would be under the smallest share


def test_beside_other_jobs_a_job_keeps_only_a_share_within_its_slot() -> None:
    cfg = RoundConfig(resize_threshold_pct=15)
    running = job(10, current_gpu_id=1, current_sm_pct=40)
    assert keeps_share(running, 30, cfg) and not keeps_share(running, 30, cfg, slots_on_gpu=2)
    assert keeps_share(running, 40, cfg, slots_on_gpu=2) and keeps_share(running, 60, cfg, slots_on_gpu=2)


# Jobs that need only 40 % of the SMs: at 40 % each runs as fast as at 80 %, so two per GPU pay.
SMALL_JOBS = {"t4": StubPredictor(a=2.5), "a10": StubPredictor(a=2.5)}


def test_overloaded_round_places_two_jobs_per_gpu_within_share_and_quota() -> None:
    gpus = [gpu(i, forecast_sm_pct=10.0, allowance=0.5) for i in range(1, 3)]
    jobs = [job(10 + j, mem_bytes=2 * GIB) for j in range(4)]
    cfg = RoundConfig(max_jobs_per_gpu=2)
    res = plan_round(gpus, jobs, SMALL_JOBS, cfg)
    assert len(res.placements) == 4 and res.certified_optimal
    per_gpu = defaultdict(list)
    for p in res.placements:
        per_gpu[p.gpu_id].append(p)
    for gid, ps in per_gpu.items():
        g = next(x for x in gpus if x.gpu_id == gid)
        assert len(ps) == 2 and sorted(p.slot for p in ps) == [0, 1]
        whole = int(offline_sm_pct(g.forecast_sm_pct, cfg.sm))
        assert sum(p.sm_pct for p in ps) <= whole
        assert sum(p.mem_quota_bytes for p in ps) <= mem_quota_bytes(g, cfg)
    assert plan_violations(gpus, jobs, res.placements, res.actions, cfg.sm, cfg.max_jobs_per_gpu) == []
    # With one job per GPU the same round leaves two jobs out.
    assert len(plan_round(gpus, jobs, SMALL_JOBS, RoundConfig()).placements) == 2


def test_a_split_that_does_not_pay_is_undone() -> None:
    gpus = [gpu(i, forecast_sm_pct=10.0, allowance=0.5) for i in range(1, 3)]
    jobs = [job(10 + j) for j in range(4)]
    cfg = RoundConfig(max_jobs_per_gpu=2)
    # Throughput linear in the share: two jobs at 40 % (× the co-runner factor) make less than one at 80 %.
    res = plan_round(gpus, jobs, PREDICTORS, cfg)
    assert sorted(p.sm_pct for p in res.placements) == [80, 80]
    dense = plan_round_dense(gpus, jobs, PREDICTORS, cfg)
    assert dense.matching_objective == pytest.approx(res.matching_objective)
    # Split slots no job can take: the slowdown at the whole share (1.08) is within 0.1 but not within 0.1 / 2.
    res = plan_round([gpu(i, forecast_sm_pct=10.0, allowance=0.1) for i in range(1, 3)], jobs, SMALL_JOBS, cfg)
    assert sorted(p.sm_pct for p in res.placements) == [80, 80]


def test_a_lone_job_still_gets_the_whole_offline_share() -> None:
    gpus = [gpu(1, forecast_sm_pct=20.0), gpu(2, forecast_sm_pct=20.0)]
    res = plan_round(gpus, [job(10)], PREDICTORS, RoundConfig(max_jobs_per_gpu=3))
    (p,) = res.placements
    assert p.sm_pct == int(offline_sm_pct(20.0, SmPolicy()))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(1, 12), st.integers(0, 30), st.sampled_from([0.0, 0.05]),
       st.sampled_from([2, 3]))
def test_several_jobs_per_gpu_equals_the_dense_reference(seed, n, m, penalty, k) -> None:
    gpus, jobs = random_cluster(seed, n, m, running=0.4)
    # Jobs running together on a GPU (as a round with slots leaves them).
    rng = np.random.default_rng(seed)
    for j in range(len(jobs)):
        if jobs[j].current_gpu_id is None and rng.random() < 0.2 and n:
            host = gpus[int(rng.integers(n))]
            jobs[j] = replace(jobs[j], current_gpu_id=host.gpu_id, current_sm_pct=int(rng.integers(1, 5) * 10))
    preds = {"t4": SmoothStub(seed), "a10": SmoothStub(seed + 1)}
    cfg = RoundConfig(migration_penalty=penalty, max_jobs_per_gpu=k, corunner_efficiency=0.8)
    fast = plan_round(gpus, jobs, preds, cfg)
    dense = plan_round_dense(gpus, jobs, preds, cfg)
    assert fast.certified_optimal
    assert fast.matching_objective == pytest.approx(dense.matching_objective, abs=1e-9)
    assert fast.feasible_pairs == dense.feasible_pairs
    placed = defaultdict(int)
    for p in fast.placements:
        placed[p.gpu_id] += 1
    assert max(placed.values(), default=0) <= k
    assert plan_violations(gpus, jobs, fast.placements, fast.actions, cfg.sm, k) == []


def test_a_gpu_that_is_not_healthy_is_never_split() -> None:
    gpus = [gpu(1, health=GpuHealth.UNHEALTHY, forecast_sm_pct=10.0, current_job_id=10, current_sm_pct=80),
            gpu(2, forecast_sm_pct=10.0)]
    jobs = [job(10, current_gpu_id=1, current_sm_pct=80), job(11), job(12)]
    res = plan_round(gpus, jobs, PREDICTORS, RoundConfig(max_jobs_per_gpu=2))
    on_1 = [p for p in res.placements if p.gpu_id == 1]
    assert [p.job_id for p in on_1] == [10]
    assert {a.job_id: a.action for a in res.actions}[10] == Action.KEEP


def test_jobs_of_several_users_never_share_a_gpu() -> None:
    # Two GPUs split in two, four jobs of two users, two of each: the matching may mix them, the round
    # regroups them one user per GPU and still places all four.
    gpus = [gpu(i, forecast_sm_pct=10.0, allowance=0.5) for i in range(1, 3)]
    jobs = [replace(job(10 + j, mem_bytes=2 * GIB), run_as_user=("ana", "bo")[j % 2]) for j in range(4)]
    cfg = RoundConfig(max_jobs_per_gpu=2)
    res = plan_round(gpus, jobs, SMALL_JOBS, cfg)
    user = {j.job_id: j.run_as_user for j in jobs}
    per_gpu = defaultdict(set)
    for p in res.placements:
        per_gpu[p.gpu_id].add(user[p.job_id])
    assert len(res.placements) == 4 and sorted(map(sorted, per_gpu.values())) == [["ana"], ["bo"]]
    assert plan_violations(gpus, jobs, res.placements, res.actions, cfg.sm, 2) == []
    # Jobs of one user (or of unknown user) are placed two per GPU without any regrouping.
    same = plan_round(gpus, [replace(j, run_as_user="ana") for j in jobs], SMALL_JOBS, cfg)
    assert len(same.placements) == 4 and "one_user_per_gpu" not in same.stats


def test_jobs_regrouping_cannot_place_wait_with_their_reason() -> None:
    # One GPU split in two, a job of each of two users: one of them waits, and the plan's bound says what that may cost.
    gpus = [gpu(1, forecast_sm_pct=10.0, allowance=0.5)]
    jobs = [replace(job(10, mem_bytes=2 * GIB), run_as_user="ana"), replace(job(11, mem_bytes=2 * GIB), run_as_user="bo")]
    res = plan_round(gpus, jobs, SMALL_JOBS, RoundConfig(max_jobs_per_gpu=2))
    (p,) = res.placements
    got = res.stats["one_user_per_gpu"]
    assert got["dropped"] == 1 and got["lost_weight"] > 0
    assert not res.certified_optimal and res.optimality_gap_bound >= got["lost_weight"]
    assert res.stats["unplaced"]["counts"] == {"one_user_per_gpu": 1}


def test_one_user_per_gpu_regroups_by_weight() -> None:
    from scheduler_core.jobs.run_as import one_user_per_gpu

    w = np.array([[1.0, 2.0, 9.0, 1.0, 1.0], [1.0, 2.0, 9.0, 1.0, 1.0]])  # (GPU, job)
    users = ["a", "b", None, "a", "b"]
    # GPU 0 got jobs 0 (a), 1 (b), 2 (unknown); GPU 1 got 3 (a), 4 (b); three slots on GPU 0, two on GPU 1.
    col_gpu = np.array([0, 0, 0, 1, 1])
    weight = lambda c, j: w[col_gpu[np.asarray(c)], np.asarray(j)]  # noqa: E731
    cols, js, dropped = one_user_per_gpu(np.array([0, 1, 2, 3, 4]), np.array([0, 1, 2, 3, 4]), col_gpu, users, weight)
    placed = dict(zip(js.tolist(), col_gpu[cols].tolist()))
    assert placed[2] == 0 and dropped.tolist() == []
    # b weighs most on GPU 0 (2 + 1 against 1 + 1 for a, beside the unknown user's job): a takes GPU 1.
    assert {placed[1], placed[4]} == {0} and {placed[0], placed[3]} == {1}
    # Nothing mixed: unchanged.
    cols, js, dropped = one_user_per_gpu(np.array([0, 3]), np.array([0, 1]), col_gpu, users, weight)
    assert cols.tolist() == [0, 3] and js.tolist() == [0, 1] and dropped.size == 0


def test_the_plan_check_refuses_two_users_on_one_gpu() -> None:
    gpus = [gpu(1, forecast_sm_pct=10.0)]
    jobs = [replace(job(10), run_as_user="ana"), replace(job(11), run_as_user="bo")]
    res = plan_round(gpus, [replace(j, run_as_user=None) for j in jobs], SMALL_JOBS, RoundConfig(max_jobs_per_gpu=2))
    assert len(res.placements) == 2
    got = plan_violations(gpus, jobs, res.placements, res.actions, SmPolicy(), 2)
    assert got == ["GPU 1 hosts jobs of 2 users (ana, bo): MPS serves one"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(1, 10), st.integers(0, 30), st.sampled_from([2, 3]),
       st.integers(1, 3))
def test_with_users_every_gpu_hosts_one_user_and_the_bound_covers_the_loss(seed, n, m, k, n_users) -> None:
    gpus, jobs = random_cluster(seed, n, m, running=0.0)
    rng = np.random.default_rng(seed)
    jobs = [replace(j, run_as_user=None if rng.random() < 0.2 else f"u{rng.integers(n_users)}") for j in jobs]
    preds = {"t4": SmoothStub(seed), "a10": SmoothStub(seed + 1)}
    cfg = RoundConfig(max_jobs_per_gpu=k, corunner_efficiency=0.8)
    res = plan_round(gpus, jobs, preds, cfg)
    assert plan_violations(gpus, jobs, res.placements, res.actions, cfg.sm, k) == []
    # The same round with every job of one user is the problem without the constraint: its optimum
    # bounds this one from above, and the plan is within its stated bound of it.
    free = plan_round(gpus, [replace(j, run_as_user=None) for j in jobs], preds, cfg)
    assert res.objective <= free.matching_objective + 1e-9
    assert free.certified_optimal and res.optimality_gap_bound is not None
    assert free.matching_objective - res.matching_objective <= res.optimality_gap_bound + 1e-6
    assert res.certified_optimal == ("one_user_per_gpu" not in res.stats or res.stats["one_user_per_gpu"]["lost_weight"] <= 1e-9)
