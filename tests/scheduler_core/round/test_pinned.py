"""A running job that does not checkpoint is never moved: kept where it runs, at the share it runs with."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_core.domain import Action, GpuHealth
from scheduler_core.round.check import plan_violations
from scheduler_core.round.plan import RoundConfig, SmPolicy, from_snapshot, plan_round, snapshot
from tests.scheduler_core.round.test_plan import PREDICTORS, actions, gpu, job, placed


def pinned(job_id: int, gpu_id: int, pct: int, **kw):
    return replace(job(job_id, current_gpu_id=gpu_id, current_sm_pct=pct, **kw), movable=False)


def test_a_movable_job_migrates_to_the_much_better_gpu_a_pinned_one_stays() -> None:
    gpus = [gpu(1, forecast_sm_pct=80.0, current_job_id=10, current_sm_pct=10), gpu(2, forecast_sm_pct=20.0)]
    assert actions(plan_round(gpus, [job(10, current_gpu_id=1, current_sm_pct=10)], PREDICTORS)) == {
        10: (Action.MIGRATE, 2, 1, 70)}
    result = plan_round(gpus, [pinned(10, 1, 10)], PREDICTORS)
    assert actions(result) == {10: (Action.KEEP, 1, 1, 10)}
    (p,) = result.placements
    assert (p.gpu_id, p.sm_pct) == (1, 10)
    assert p.predicted_norm_tput == pytest.approx(0.1)  # predicted at its running share
    assert result.stats["pinned"]["kept"] == 1


def test_a_pinned_job_is_not_restarted_with_a_smaller_share() -> None:
    # 86 % running where the plan would give 70 %: a movable job is restarted in place, a pinned one kept.
    gpus = [gpu(1, forecast_sm_pct=20.0, current_job_id=10, current_sm_pct=86)]
    assert actions(plan_round(gpus, [job(10, current_gpu_id=1, current_sm_pct=86)], PREDICTORS))[10][0] == \
        Action.MIGRATE
    assert actions(plan_round(gpus, [pinned(10, 1, 86)], PREDICTORS)) == {10: (Action.KEEP, 1, 1, 86)}


def test_its_gpu_is_not_given_to_another_job_and_the_others_are_matched_elsewhere() -> None:
    gpus = [gpu(1, forecast_sm_pct=10.0, current_job_id=10, current_sm_pct=30), gpu(2, forecast_sm_pct=40.0)]
    result = plan_round(gpus, [pinned(10, 1, 30), job(11), job(12)], PREDICTORS)
    acts = actions(result)
    assert acts[10] == (Action.KEEP, 1, 1, 30)
    others = {j: a for j, a in acts.items() if j != 10}
    assert len(others) == 1 and list(others.values())[0][:2] == (Action.START, 2)
    assert sorted(placed(result).values()) == [1, 2]
    assert result.objective == pytest.approx(sum(p.predicted_norm_tput for p in result.placements))


def test_admission_never_preempts_a_pinned_job() -> None:
    # One GPU, the running pinned job has far more work left than the newcomer: a movable one would be preempted.
    gpus = [gpu(1, forecast_sm_pct=20.0, current_job_id=10, current_sm_pct=70)]
    long_running = replace(job(10, current_gpu_id=1, current_sm_pct=70), remaining_s=1e6)
    short = replace(job(11), remaining_s=10.0)
    assert actions(plan_round(gpus, [long_running, short], PREDICTORS))[10][0] == Action.EVICT
    kept = plan_round(gpus, [replace(long_running, movable=False), short], PREDICTORS)
    assert actions(kept) == {10: (Action.KEEP, 1, 1, 70)}
    assert placed(kept) == {10: 1}  # its GPU is taken: the newcomer waits


def test_a_pinned_job_on_a_gpu_over_its_allowance_is_kept_and_reported() -> None:
    # The service now tolerates no slowdown: a new pair would be infeasible; the pinned job stays, reported.
    gpus = [gpu(1, forecast_sm_pct=20.0, allowance=0.0, current_job_id=10, current_sm_pct=70)]
    result = plan_round(gpus, [pinned(10, 1, 70)], PREDICTORS)
    assert actions(result) == {10: (Action.KEEP, 1, 1, 70)}
    assert result.stats["pinned"]["over_allowance"] == [10]


def test_an_unhealthy_gpu_keeps_a_pinned_job_where_a_movable_one_would_be_moved() -> None:
    # Unhealthy takes no new work: a movable job running above the planned share moves to a Healthy GPU; a pinned
    # one runs on where it is (the node's SysMonitor evicts it if the GPU goes Overlimit).
    sick = gpu(1, forecast_sm_pct=20.0, health=GpuHealth.UNHEALTHY, current_job_id=10, current_sm_pct=90)
    gpus = [sick, gpu(2, forecast_sm_pct=40.0)]
    assert actions(plan_round(gpus, [job(10, current_gpu_id=1, current_sm_pct=90)], PREDICTORS)) == {
        10: (Action.MIGRATE, 2, 1, 50)}
    result = plan_round(gpus, [pinned(10, 1, 90), job(11)], PREDICTORS)
    assert actions(result) == {10: (Action.KEEP, 1, 1, 90), 11: (Action.START, 2, None, 50)}
    assert plan_violations(gpus, [pinned(10, 1, 90), job(11)], result.placements, result.actions, SmPolicy()) == []


@pytest.mark.parametrize("health", [GpuHealth.OVERLIMIT, GpuHealth.DISABLED, GpuHealth.INIT])
def test_a_failing_gpu_lets_the_matching_move_it(health: GpuHealth) -> None:
    gpus = [gpu(1, health=health, current_job_id=10, current_sm_pct=50), gpu(2, forecast_sm_pct=20.0)]
    assert actions(plan_round(gpus, [pinned(10, 1, 50)], PREDICTORS)) == {10: (Action.MIGRATE, 2, 1, 70)}


def test_a_pinned_job_whose_gpu_the_round_does_not_see_gets_no_action() -> None:
    result = plan_round([gpu(2, forecast_sm_pct=20.0)], [pinned(10, 1, 50), job(11)], PREDICTORS)
    assert actions(result) == {11: (Action.START, 2, None, 70)}


def test_a_pending_unmovable_job_is_placed_like_any_other() -> None:
    result = plan_round([gpu(1)], [replace(job(10), movable=False)], PREDICTORS)
    assert actions(result) == {10: (Action.START, 1, None, 70)}


def test_snapshot_keeps_movability_and_replays_the_same_plan() -> None:
    gpus = [gpu(1, forecast_sm_pct=80.0, current_job_id=10, current_sm_pct=10), gpu(2, forecast_sm_pct=20.0)]
    jobs = [pinned(10, 1, 10), job(11)]
    g2, j2 = from_snapshot(snapshot(gpus, jobs))
    assert [j.movable for j in j2] == [False, True]
    assert actions(plan_round(g2, j2, PREDICTORS, RoundConfig())) == actions(plan_round(gpus, jobs, PREDICTORS))
