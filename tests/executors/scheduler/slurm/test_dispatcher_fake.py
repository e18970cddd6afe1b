"""The Slurm dispatcher against a stateful fake slurmrestd: what one placement sends, the plan comment with
xCUDA's gains, reconciliation on a re-run, the pick-up filter and ``muxflow submit``'s path (no Slurm needed)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.scheduler.slurm.backend import SlurmBackend, XcudaGains, placement_plan
from executors.scheduler.slurm.pickup import import_submissions, spec_from_job, submission_comment, submit_held
from executors.scheduler.submission import JobSpec, SubmissionError
from executors.slurm import plan as plans
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import Action, JobState, PlanAction, PlannedPlacement, RoundResult
from tests.executors.scheduler.slurm.fake_slurm import PLAN_KEY, FakeClock, FakeSlurm, make_job, store_with_fake_nodes

GOOD = "muxflow: type='ResNet-50 (batch size 64)' mem=2GiB gpu-types=t4,a10 ckpt=/ckpt/{n} steps=100"
KNOWN = {"ResNet-50 (batch size 64)"}


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return store_with_fake_nodes(tmp_path)


def _pending(store: Store, fake: FakeSlurm, sids: list[int]) -> dict[int, int]:
    rep = import_submissions(store, fake, KNOWN, only=sids)
    with store.session() as s:
        for j in rep.imported:
            transition(s, j, JobState.PROFILING, "test")
            transition(s, j, JobState.PENDING, "test")
        return {j.slurm_job_id: j.id for j in s.scalars(select(m.OfflineJob).where(m.OfflineJob.id.in_(rep.imported)))}


def _gpu(store: Store, node: str, index: int) -> int:
    with store.session() as s:
        return next(g.id for g in s.scalars(select(m.Gpu)) if (g.node.name, g.gpu_index) == (node, index))


def _round(store: Store, starts: list[tuple[int, int, int]], minute: int = 0) -> tuple[int, RoundResult]:
    result = RoundResult([PlannedPlacement(j, g, p, 2 * 1024**3, 0.5, 0.1) for j, g, p in starts],
                         [PlanAction(Action.START, j, g, None, p) for j, g, p in starts], 0.5, 8, len(starts), 8)
    with store.session() as s:
        rnd = repo.record_round(s, dt.datetime(2026, 1, 5, tzinfo=dt.UTC) + dt.timedelta(minutes=minute), result,
                                {}, False, len(starts), {j: "start" for j, _, _ in starts})
        return rnd.id, result


def test_a_start_is_one_read_and_one_update_carrying_the_plan_and_the_gains(store: Store) -> None:
    fake = FakeSlurm([make_job(11, comment=GOOD.format(n="a")), make_job(12, comment=GOOD.format(n="b"))])
    ids = _pending(store, fake, [11, 12])
    gains = XcudaGains(kp=0.5, ki=12, kd=0.01)
    rid, result = _round(store, [(ids[11], _gpu(store, "mx-a10-1", 2), 35), (ids[12], _gpu(store, "mx-t4-1", 0), 20)])
    fake.calls.clear()
    assert SlurmBackend(lambda: fake, plan_key=PLAN_KEY, gains=gains).dispatch(store, rid, result, dt.datetime.now(dt.UTC)) == (2, 0)
    updates = fake.sent("update_job")
    assert [u[1] for u in updates] == [11, 12] and len(fake.sent("get_job")) == 2
    up = updates[0][2]
    assert (up.nodelist, up.gres_per_node, up.hold, up.eligible_now) == ("mx-a10-1", "mps:35", False, True)
    plan = plans.decode(up.comment, PLAN_KEY, 11)  # signed, for this very Slurm job
    assert plan.fields() == {"slurm": "11", "job": str(ids[11]), "kind": "place", "gpu": "2", "pct": "35",
                             "mem": str(2 * 1024**3), "kp": "0.5", "ki": "12.0", "kd": "0.01"}
    with pytest.raises(plans.PlanError, match="bad signature"):
        plans.decode(up.comment, bytes(32), 11)
    j = fake.jobs[11]
    assert not j.held and j.required_nodes == ("mx-a10-1",) and j.mps_pct == 35
    with store.session() as s:
        assert {r.status for r in s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == rid))} == {"done"}


def test_a_restarted_dispatch_reconciles_and_sends_nothing_twice(store: Store) -> None:
    fake = FakeSlurm([make_job(21, comment=GOOD.format(n="a"))])
    ids = _pending(store, fake, [21])
    rid, result = _round(store, [(ids[21], _gpu(store, "mx-t4-1", 1), 40)])
    be = SlurmBackend(lambda: fake, plan_key=PLAN_KEY)
    # a dispatcher that died after Slurm took the update but before the result was written
    cluster = be.cluster(store, rid)
    cluster.dispatch(list(result.actions), dt.datetime.now(dt.UTC))
    fake.calls.clear()
    assert be.dispatch(store, rid, result, dt.datetime.now(dt.UTC)) == (1, 0)
    assert fake.sent("update_job") == []  # read, found placed as planned: reconciled
    fake.calls.clear()
    assert be.dispatch(store, rid, result, dt.datetime.now(dt.UTC)) == (0, 0)  # all done: nothing read or sent
    assert fake.sent("get_job") == [] and fake.sent("update_job") == []


def test_a_job_placed_with_other_gains_is_placed_again(store: Store) -> None:
    fake = FakeSlurm([make_job(31, comment=GOOD.format(n="a"))])
    ids = _pending(store, fake, [31])
    rid, result = _round(store, [(ids[31], _gpu(store, "mx-t4-1", 1), 40)])
    SlurmBackend(lambda: fake, plan_key=PLAN_KEY, gains=XcudaGains(kp=2)).cluster(store, rid).dispatch(list(result.actions),
                                                                                      dt.datetime.now(dt.UTC))
    fake.calls.clear()
    assert SlurmBackend(lambda: fake, plan_key=PLAN_KEY).dispatch(store, rid, result, dt.datetime.now(dt.UTC)) == (1, 0)
    [(_, _, up)] = fake.sent("update_job")
    assert plans.decode(fake.jobs[31].comment, PLAN_KEY, 31).kp == 1.0


@pytest.mark.parametrize("kwargs", [{"kp": -1}, {"ki": 1001}, {"kd": 11}, {"kp": float("nan")}, {"ki": "20"},
                                    {"kd": True}])
def test_gains_outside_what_xcuda_accepts_are_refused(kwargs) -> None:
    with pytest.raises(ValueError, match="xcuda gains"):
        XcudaGains(**kwargs)


def test_placement_plan_defaults_are_xcudas_own() -> None:
    p = placement_plan(7, 4711, 2, 35, 2**30, XcudaGains())
    assert p.fields() == {"slurm": "4711", "job": "7", "kind": "place", "gpu": "2", "pct": "35", "mem": str(2**30),
                          "kp": "1.0", "ki": "20.0", "kd": "0.0"}
    assert "mem" not in placement_plan(7, 4711, 2, 35, None).fields()
    # a tiny quota (a profiled peak of a few KiB) goes out at the plans' floor, never near 0 (MPS's "no limit")
    assert placement_plan(7, 4711, 2, 35, 1024).mem_bytes == plans.MIN_MEM_BYTES


def test_submission_comment_reads_back_as_the_spec() -> None:
    spec = JobSpec(name="my job", command="x", job_type="ResNet-50 (batch size 64)", mem_bytes=3 * 1024**3,
                   allowed_gpu_types=("t4", "a10"), checkpoint_dir="/ckpt/with space", total_steps=500, priority=-3)
    back = spec_from_job(make_job(5, comment=submission_comment(spec), name="slurm-name"))
    assert (back.name, back.job_type, back.mem_bytes, back.allowed_gpu_types, back.checkpoint_dir, back.total_steps,
            back.priority) == ("my job", spec.job_type, spec.mem_bytes, ("t4", "a10"), "/ckpt/with space", 500, -3)


def test_pickup_only_touches_the_jobs_it_is_given(store: Store) -> None:
    fake = FakeSlurm([make_job(41, comment=GOOD.format(n="a")), make_job(42, comment="someone else's, no spec")])
    rep = import_submissions(store, fake, KNOWN, only=[41])
    assert len(rep.imported) == 1 and rep.rejected == []
    assert fake.jobs[42].state == "PENDING" and fake.jobs[42].held  # not rejected, not cancelled


def _spec(**over) -> JobSpec:
    base = dict(name="cli", command="train.sh", job_type="ResNet-50 (batch size 64)", mem_bytes=1024**3,
                allowed_gpu_types=("t4",), checkpoint_dir="/ckpt/cli", total_steps=10)
    return JobSpec(**{**base, **over})


def test_submit_held_sends_held_with_the_spec_and_picks_it_up(store: Store) -> None:
    fake = FakeSlurm()
    sid, rep = submit_held(store, fake, _spec(), "#!/bin/sh\ntrue\n", mps_pct=25, working_dir="/tmp",
                           environment={"PATH": "/bin"}, known_job_types=KNOWN)
    assert fake.jobs[sid].held and fake.jobs[sid].mps_pct == 25 and len(rep.imported) == 1
    with store.session() as s:
        job = s.get(m.OfflineJob, rep.imported[0])
        assert (job.slurm_job_id, job.name, job.state, job.mem_bytes) == (sid, "cli", "SUBMITTED", 1024**3)


@pytest.mark.parametrize(("over", "mps", "script", "field"), [
    ({"allowed_gpu_types": ("v100",)}, 25, "#!/bin/sh\n", "gpu_types"),
    ({"job_type": "Tetris"}, 25, "#!/bin/sh\n", "job_type"),
    ({}, 0, "#!/bin/sh\n", "mps"),
    ({}, 101, "#!/bin/sh\n", "mps"),
    ({}, 25, "echo no interpreter line\n", "script"),
])
def test_submit_held_refuses_bad_input_before_sending_anything(store: Store, over, mps, script, field) -> None:
    fake = FakeSlurm()
    with pytest.raises(SubmissionError) as exc:
        submit_held(store, fake, _spec(**over), script, mps_pct=mps, working_dir="/tmp", environment={},
                    known_job_types=KNOWN)
    assert exc.value.field == field and fake.calls == []
    with store.session() as s:
        assert s.scalars(select(m.OfflineJob)).all() == []


@pytest.mark.parametrize("requeued_at", [1000.02, 1000.97])
def test_a_migrated_job_is_released_in_a_later_second_than_its_requeue(store: Store, requeued_at: float) -> None:
    """slurmd refuses a launch credential no newer, in whole seconds, than the kill of the previous run, and the
    job then ends FAILED: the release after a requeue waits for the next second of Slurm's clock (plus the
    margin for the clocks' skew), and no longer."""
    from executors.scheduler.slurm.backend import SlurmCluster
    from executors.slurm.retry import Retry

    clock = FakeClock(requeued_at)
    fake = FakeSlurm([make_job(11, comment=GOOD.format(n="a"))], clock=clock)
    ids = _pending(store, fake, [11])
    fake.jobs[11] = replace(fake.jobs[11], state="RUNNING", priority=100, nodes=("mx-t4-1",))
    released_at: list[float] = []
    update_job = fake.update_job
    fake.update_job = lambda sid, up: (released_at.append(clock()), update_job(sid, up))[1]
    cl = SlurmCluster(store, fake, plan_key=PLAN_KEY, retry=Retry(5.0, sleep=clock.sleep, clock=clock), wall_clock=clock)
    act = PlanAction(Action.MIGRATE, ids[11], _gpu(store, "mx-a10-1", 1), _gpu(store, "mx-t4-1", 0), 40)
    (res,) = cl.dispatch([act], dt.datetime.now(dt.UTC))
    assert res.ok, res.detail
    assert fake.jobs[11].required_nodes == ("mx-a10-1",) and not fake.jobs[11].held
    assert released_at and int(released_at[-1]) == 1001 and released_at[-1] >= 1001.1 - 1e-9
    assert sum(clock.slept) <= 1001.1 - requeued_at + 1e-9


@pytest.mark.parametrize(("now", "submitted", "restarts"), [
    (1000.2, 1000.0, 0),  # submitted a moment ago, never requeued: never killed
    (2000.5, 1900.0, 1),  # requeued long ago
], ids=["submitted-just-now", "requeued-long-ago"])
def test_a_job_not_requeued_within_the_second_is_released_without_waiting(store: Store, now: float, submitted: float,
                                                                          restarts: int) -> None:
    from executors.scheduler.slurm.backend import SlurmCluster
    from executors.slurm.retry import Retry

    clock = FakeClock(now)
    fake = FakeSlurm([make_job(11, comment=GOOD.format(n="a"))], clock=clock)
    ids = _pending(store, fake, [11])
    fake.jobs[11] = replace(fake.jobs[11], submit_time_utc=dt.datetime.fromtimestamp(submitted, tz=dt.UTC),
                            restart_count=restarts)
    cl = SlurmCluster(store, fake, plan_key=PLAN_KEY, retry=Retry(5.0, sleep=clock.sleep, clock=clock), wall_clock=clock)
    (res,) = cl.dispatch([PlanAction(Action.START, ids[11], _gpu(store, "mx-a10-1", 1), None, 40)],
                         dt.datetime.now(dt.UTC))
    assert res.ok and clock.slept == [] and not fake.jobs[11].held
