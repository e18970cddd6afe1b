"""One user per GPU (scheduler_core.jobs.run_as): a job shares a GPU only with a replica of its own user.

The rule against the dense reference (every pair checked on its own) on random clusters with random
users, the reason a job left out by it gets, running jobs on a GPU of another user, and that a round
without declared users is the round it was.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_core.domain import Action, GpuHealth
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.round.weights import build_graph
from scheduler_core.round.plan import RoundConfig, plan_round
from scheduler_core.round.dense import plan_round_dense
from scheduler_core.jobs.run_as import ANY, OTHER, class_user, may_share
from scheduler_core.jobs.unplaced import RUN_AS_USER, groups
from tests.scheduler_core.round.test_dense import SmoothStub, check_plan, random_cluster

USERS = ["alice", "bob", "carol"]


def _with_users(gpus, jobs, seed: int, gpu_none: float = 0.2, job_none: float = 0.1):
    rng = np.random.default_rng(seed)

    def pick(p_none: float, pool: list[str]) -> str | None:
        return None if rng.random() < p_none else pool[int(rng.integers(len(pool)))]

    gpus = [replace(g, run_as_user=pick(gpu_none, USERS[:2])) for g in gpus]
    jobs = [replace(j, run_as_user=pick(job_none, USERS)) for j in jobs]  # carol: no replica runs as her
    return gpus, jobs


def _preds(seed: int) -> dict:
    return {"t4": SmoothStub(seed), "a10": SmoothStub(seed + 1)}


def test_may_share_and_class_keys() -> None:
    assert may_share(None, "a") and may_share("a", None) and may_share("a", "a") and may_share(None, None)
    assert not may_share("a", "b")
    users = frozenset({"a", "b"})
    assert class_user("a", users) == "a" and class_user("z", users) == OTHER and class_user(None, users) is ANY
    assert class_user("a", frozenset()) is ANY  # no replica declares a user: the rule is off


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(0, 24), st.integers(0, 20), st.sampled_from([0.0, 0.3]),
       st.sampled_from([0, 2]))
def test_round_honours_users_and_equals_the_dense_reference(seed, n, m, penalty, fallback_levels) -> None:
    gpus, jobs = _with_users(*random_cluster(seed, n, m), seed)
    preds = _preds(seed)
    cfg = RoundConfig(migration_penalty=penalty, sm=SmPolicy(fallback_levels=fallback_levels))
    fast = plan_round(gpus, jobs, preds, cfg)
    dense = plan_round_dense(gpus, jobs, preds, cfg)
    assert fast.certified_optimal
    assert fast.matching_objective == pytest.approx(dense.matching_objective, abs=1e-9)
    assert fast.feasible_pairs == dense.feasible_pairs
    check_plan(fast, gpus, jobs, preds, cfg)
    gpu = {g.gpu_id: g for g in gpus}
    job = {j.job_id: j for j in jobs}
    for p in fast.placements:
        assert may_share(gpu[p.gpu_id].run_as_user, job[p.job_id].run_as_user), p


class FlatStub:
    """Every pair fits: throughput 0.8 less 0.001 per online SM %, slowdown +5 % (a GPU's load sets its weight)."""

    def predict(self, x):
        return np.clip(0.8 - 0.001 * x[:, 1], 0.1, 1.0), np.full(x.shape[0], 1.05)


def _flat() -> dict:
    return {"t4": FlatStub(), "a10": FlatStub()}


def _healthy_cluster(seed: int, n: int, m: int):
    gpus, jobs = random_cluster(seed, n, m, running=0.0)
    gpus = [replace(g, health=GpuHealth.HEALTHY, gpu_type="a10", forecast_sm_pct=10.0, forecast_mem_bytes=2 * 2**30,
                    slowdown_allowance=0.5) for g in gpus]
    jobs = [replace(j, allowed_gpu_types=frozenset({"a10"}), mem_bytes=2 * 2**30) for j in jobs]
    return gpus, jobs


def test_a_job_of_another_user_waits_with_its_reason() -> None:
    gpus, jobs = _healthy_cluster(7, 4, 3)
    gpus = [replace(g, run_as_user="alice") for g in gpus]
    jobs = [replace(jobs[0], run_as_user="alice"), replace(jobs[1], run_as_user="bob"), replace(jobs[2], run_as_user=None)]
    preds = _flat()
    base = plan_round([replace(g, run_as_user=None) for g in gpus], jobs, preds)
    assert {p.job_id for p in base.placements} == {j.job_id for j in jobs}, "without the rule every job fits"
    res = plan_round(gpus, jobs, preds)
    assert {p.job_id for p in res.placements} == {jobs[0].job_id, jobs[2].job_id}
    [(reason, detail, ids)] = groups(res.stats["unplaced"])
    assert (reason, ids) == (RUN_AS_USER, [jobs[1].job_id])
    assert detail == "runs as bob; the online replicas of its 4 candidate GPU(s) run as alice (MPS serves one user per GPU)"
    # One GPU of bob's: bob's job goes there.
    gpus[2] = replace(gpus[2], run_as_user="bob")
    res = plan_round(gpus, jobs, preds)
    on = {p.job_id: p.gpu_id for p in res.placements}
    assert on[jobs[1].job_id] == gpus[2].gpu_id and on[jobs[0].job_id] != gpus[2].gpu_id
    assert not res.stats["unplaced"]["counts"]


def test_a_job_running_next_to_another_users_replica_is_moved_or_evicted() -> None:
    gpus, jobs = _healthy_cluster(11, 2, 1)
    job = replace(jobs[0], run_as_user="bob", current_gpu_id=gpus[0].gpu_id, current_sm_pct=30)
    gpus = [replace(gpus[0], run_as_user="alice", current_job_id=job.job_id, current_sm_pct=30),
            replace(gpus[1], run_as_user="bob")]
    res = plan_round(gpus, [job], _flat())
    [act] = res.actions
    assert (act.action, act.gpu_id) == (Action.MIGRATE, gpus[1].gpu_id)
    res = plan_round(gpus[:1], [job], _flat())
    assert [a.action for a in res.actions] == [Action.EVICT]
    # The same on an Unhealthy GPU, where a running job may otherwise stay.
    sick = [replace(gpus[0], health=GpuHealth.UNHEALTHY)]
    assert [a.action for a in plan_round(sick, [job], _flat()).actions] == [Action.EVICT]


def test_without_declared_users_the_round_is_unchanged() -> None:
    gpus, jobs = random_cluster(3, 30, 40)
    preds = _preds(3)
    plain = plan_round(gpus, jobs, preds)
    users = [replace(j, run_as_user=USERS[k % 3]) for k, j in enumerate(jobs)]
    same = plan_round(gpus, users, preds)
    assert [(p.job_id, p.gpu_id, p.sm_pct) for p in same.placements] == \
        [(p.job_id, p.gpu_id, p.sm_pct) for p in plain.placements]
    assert same.stats["classes"] == plain.stats["classes"]


def test_classes_grow_with_the_replicas_users_not_the_jobs() -> None:
    gpus, jobs = random_cluster(5, 40, 200, running=0.0)
    plain = build_graph(gpus, jobs, _preds(5), RoundConfig()).stats["classes"]
    gpus = [replace(g, run_as_user=USERS[i % 2]) for i, g in enumerate(gpus)]
    jobs = [replace(j, run_as_user=f"user{k}") for k, j in enumerate(jobs)]  # 200 users, 2 on the GPUs
    many = build_graph(gpus, jobs, _preds(5), RoundConfig()).stats["classes"]
    assert many <= plain  # every job's user is "another": one class key for all of them
    jobs = [replace(j, run_as_user=USERS[k % 3]) for k, j in enumerate(jobs)]
    assert build_graph(gpus, jobs, _preds(5), RoundConfig()).stats["classes"] <= 3 * plain
