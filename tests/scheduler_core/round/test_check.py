"""The independent plan feasibility check: a feasible plan passes, each broken constraint is named."""

from __future__ import annotations

from dataclasses import replace

from scheduler_core.domain import (
    Action,
    GpuCandidate,
    GpuHealth,
    JobCandidate,
    OfflineFeatures,
    OnlineFeatures,
    PlanAction,
    PlannedPlacement,
)
from scheduler_core.online.dynamic_sm import SmPolicy
from scheduler_core.round.check import plan_violations

GIB = 1024**3
ONLINE = OnlineFeatures(gpu_util_pct=30, sm_activity_pct=20, sm_occupancy_pct=11, mem_used_bytes=4 * GIB,
                        mem_bw_util_pct=10, latency_ms=5, qps=50, sm_clock_mhz=1500)
PROFILE = OfflineFeatures(gpu_util_pct=90, sm_activity_pct=70, sm_occupancy_pct=40, mem_used_bytes=2 * GIB,
                          mem_bw_util_pct=30, iter_time_s=0.1, sm_clock_mhz=1500)


def gpu(gid: int, health: GpuHealth = GpuHealth.HEALTHY, current: int | None = None, pct: int | None = None):
    return GpuCandidate(gid, "t4", 16 * GIB, 1590, health, "svc", ONLINE, 20.0, 4 * GIB, 0.2, current, pct)


def job(jid: int, cur_gpu: int | None = None, pct: int | None = None, types=frozenset({"t4"})):
    return JobCandidate(jid, 2 * GIB, types, {"t4": PROFILE}, 0, cur_gpu, pct)


def place(jid: int, gid: int, pct: int = 60, quota: int = 6 * GIB) -> PlannedPlacement:
    return PlannedPlacement(jid, gid, pct, quota, 0.7, 1.1)


def start(jid: int, gid: int, pct: int = 60) -> PlanAction:
    return PlanAction(Action.START, jid, gid, None, pct)


SM = SmPolicy()


def test_feasible_plan_has_no_violations() -> None:
    gpus = [gpu(1), gpu(2, GpuHealth.UNHEALTHY, current=11, pct=55)]
    jobs = [job(10), job(11, cur_gpu=2, pct=55)]
    placements = [place(10, 1), place(11, 2, pct=55)]
    actions = [start(10, 1), PlanAction(Action.KEEP, 11, 2, 2, 55)]
    assert plan_violations(gpus, jobs, placements, actions, SM) == []


def test_each_broken_constraint_is_reported() -> None:
    gpus = [gpu(1), gpu(2), gpu(3, GpuHealth.UNHEALTHY), gpu(4, GpuHealth.OVERLIMIT, current=13, pct=50)]
    jobs = [job(10), job(11), job(12), job(13, cur_gpu=4, pct=50), job(14, types=frozenset({"a10"}))]
    cases = {
        "placed 2 times": ([place(10, 1), place(10, 2)], [start(10, 1)]),
        "hosts 2 offline jobs": ([place(10, 1), place(11, 1)], [start(10, 1), start(11, 1)]),
        "which is Unhealthy": ([place(12, 3)], [start(12, 3)]),
        "kept on GPU 4, which is Overlimit": ([place(13, 4, pct=50)], [PlanAction(Action.KEEP, 13, 4, 4, 50)]),
        "outside [10, 90]": ([place(10, 1, pct=95)], [start(10, 1, 95)]),
        "exceeds the": ([place(10, 1, quota=13 * GIB)], [start(10, 1)]),
        "needs 2147483648 B": ([place(10, 1, quota=GIB)], [start(10, 1)]),
        "not allowed": ([place(14, 1)], [start(14, 1)]),
        "not among the round's inputs": ([place(99, 1)], [start(99, 1)]),
    }
    for needle, (placements, actions) in cases.items():
        found = plan_violations(gpus, jobs, placements, actions, SM)
        assert any(needle in v for v in found), (needle, found)


def test_kept_job_must_keep_its_share_and_fixed_policy_is_enforced() -> None:
    gpus = [gpu(1, current=10, pct=40), gpu(2)]
    jobs = [job(10, cur_gpu=1, pct=40), job(11)]
    kept_wrong = plan_violations(gpus, jobs, [place(10, 1, pct=45)], [PlanAction(Action.KEEP, 10, 1, 1, 45)], SM)
    assert any("kept at 45% but runs at 40%" in v for v in kept_wrong)
    fixed = replace(SM, fixed_pct=50)
    assert plan_violations(gpus, jobs, [place(11, 2, pct=50)], [start(11, 2, 50)], fixed) == []
    assert any("fixed share is 50%" in v for v in plan_violations(gpus, jobs, [place(11, 2, pct=60)],
                                                                 [start(11, 2, 60)], fixed))
