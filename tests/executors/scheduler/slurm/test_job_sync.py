"""Job states follow Slurm (executors.scheduler.slurm.sync) against the stateful fake slurmrestd: placed → running →
done, failures with exit codes, Slurm's own requeue, a release Slurm delayed afterwards, evictions, vanished jobs,
in-flight dispatches, idempotence and a crash between the hold and the store write. No Slurm needed."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.job.runtime.checkpoint import CheckpointStore
from executors.scheduler.slurm import sync as slurm_sync
from executors.scheduler.slurm.backend import SlurmBackend
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm.spec import JobUpdate
from executors.store import models as m
from executors.store import repo
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import Action, JobState, PlanAction, PlannedPlacement, RoundResult
from tests.executors.scheduler.slurm.fake_slurm import PLAN_KEY, FakeSlurm, make_job, store_with_fake_nodes

SPEC = "muxflow: type='ResNet-50 (batch size 64)' mem=2GiB gpu-types=t4,a10 ckpt={ckpt} steps=100"
W0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
STARTED = dt.datetime(2026, 1, 5, 0, 1, tzinfo=dt.UTC)
ENDED = dt.datetime(2026, 1, 5, 0, 9, tzinfo=dt.UTC)


@pytest.fixture()
def env(tmp_path: Path):
    ckpts = {sid: tmp_path / f"ckpt{sid}" for sid in (11, 12)}
    fake = FakeSlurm([make_job(sid, comment=SPEC.format(ckpt=d)) for sid, d in ckpts.items()])
    store = store_with_fake_nodes(tmp_path, fake)
    rep = import_submissions(store, fake, {"ResNet-50 (batch size 64)"}, only=list(ckpts))
    with store.session() as s:
        t4 = s.scalars(select(m.Gpu).where(m.Gpu.gpu_type == "t4").order_by(m.Gpu.gpu_index)).all()
        for j in rep.imported:
            transition(s, j, JobState.PROFILING, "test")
            repo.save_profile(s, j, "t4", _features(), "measured", "nvml")
            s.flush()
            s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == j)).one().measured_iter_time_s = 0.5
            transition(s, j, JobState.PENDING, "test")
        ids = {j.slurm_job_id: j.id for j in s.scalars(select(m.OfflineJob))}
        gpus = [g.id for g in t4]
    backend = SlurmBackend(lambda: fake, plan_key=PLAN_KEY, retry_deadline_s=1.0)
    return store, fake, backend, ids, gpus, ckpts


def _features():
    from scheduler_core.domain import OfflineFeatures

    return OfflineFeatures(60.0, 55.0, 40.0, 2 * 1024**3, 30.0, 0.2, 1500.0)


def _place(store: Store, backend: SlurmBackend, starts: list[tuple[int, int, int]], minute: int = 0) -> int:
    result = RoundResult([PlannedPlacement(j, g, p, 2 * 1024**3, 0.5, 0.1) for j, g, p in starts],
                         [PlanAction(Action.START, j, g, None, p) for j, g, p in starts], 0.5, 8, len(starts), 8)
    with store.session() as s:
        rnd = repo.record_round(s, W0 + dt.timedelta(minutes=minute), result, {}, False, len(starts),
                                {j: "start" for j, _, _ in starts})
        rid = rnd.id
    assert backend.dispatch(store, rid, result, W0) == (len(starts), 0)
    return rid


def _state(store: Store, job_id: int) -> str:
    with store.session() as s:
        return s.get(m.OfflineJob, job_id).state


def _start(fake: FakeSlurm, sid: int, node: str = "mx-t4-1") -> None:
    fake.jobs[sid] = replace(fake.jobs[sid], state="RUNNING", nodes=(node,), start_time_utc=STARTED)


def _history(store: Store, job_id: int) -> list[tuple[str, str]]:
    with store.session() as s:
        return [(t.from_state, t.to_state) for t in s.scalars(
            select(m.JobTransition).where(m.JobTransition.job_id == job_id).order_by(m.JobTransition.id))]


def test_placed_started_finished_is_booked_once_with_slurms_times(env) -> None:
    store, fake, backend, ids, gpus, ckpts = env
    job = ids[11]
    _place(store, backend, [(job, gpus[2], 30)])
    assert _state(store, job) == "PLACED"  # released in Slurm, not started
    assert backend.sync_jobs(store, W0).changed == 0
    _start(fake, 11)
    rep = backend.sync_jobs(store, W0)
    assert rep.transitions == {"RUNNING": 1} and _state(store, job) == "RUNNING"
    with store.session() as s:
        started = s.get(m.OfflineJob, job).started_utc
        assert started.replace(tzinfo=dt.UTC) == STARTED
    fake.jobs[11] = replace(fake.jobs[11], state="COMPLETED", exit_code=0, end_time_utc=ENDED)
    rep = backend.sync_jobs(store, W0)
    assert rep.transitions == {"DONE": 1} and rep.executions == 1
    with store.session() as s:
        j = s.get(m.OfflineJob, job)
        assert (j.state, j.exit_code, j.steps_done) == ("DONE", 0, 100)
        ex = s.scalars(select(m.JobExecution).where(m.JobExecution.job_id == job)).one()
        assert (ex.gpu_id, ex.sm_pct, ex.steps, ex.wall_s, ex.source) == (gpus[2], 30, 100, 480.0, "measured")
        assert ex.solo_equiv_s == pytest.approx(100 * 0.5)  # the measured solo iteration time
    assert _history(store, job)[-3:] == [("PENDING", "PLACED"), ("PLACED", "RUNNING"), ("RUNNING", "DONE")]
    calls = len(fake.calls)
    again = backend.sync_jobs(store, W0)  # idempotent: nothing more to do, one listing
    assert again.changed == 0 and fake.calls[calls:] == [("list_jobs",), ("list_nodes",)]


def test_a_failure_keeps_slurms_state_and_exit_code(env) -> None:
    store, fake, backend, ids, gpus, _ = env
    _place(store, backend, [(ids[11], gpus[0], 40)])
    _start(fake, 11)
    fake.jobs[11] = replace(fake.jobs[11], state="FAILED", exit_code=3, state_reason="NonZeroExitCode",
                            end_time_utc=ENDED)
    rep = backend.sync_jobs(store, W0)  # started and failed between two calls: both steps, in order
    assert rep.transitions == {"RUNNING": 1, "FAILED": 1}
    with store.session() as s:
        j = s.get(m.OfflineJob, ids[11])
        assert j.state == "FAILED" and j.exit_code == 3
        assert "NonZeroExitCode" in j.state_reason and "exit code 3" in j.state_reason


def test_slurms_own_requeue_is_held_and_queued_with_the_progress_of_its_checkpoints(env) -> None:
    store, fake, backend, ids, gpus, ckpts = env
    _place(store, backend, [(ids[12], gpus[1], 25)])
    _start(fake, 12)
    backend.sync_jobs(store, W0)
    CheckpointStore(ckpts[12]).save(40, {"loss": 1.0})
    # A node failure: Slurm requeues the job by itself, released (it would restart it unplanned).
    fake.jobs[12] = replace(fake.jobs[12], state="PENDING", priority=100, state_reason="NodeDown", nodes=(),
                            end_time_utc=ENDED)
    rep = backend.sync_jobs(store, W0)
    assert rep.held == [12] and rep.transitions == {"PENDING": 1}
    assert fake.jobs[12].held  # only a round places it again
    with store.session() as s:
        j = s.get(m.OfflineJob, ids[12])
        assert (j.state, j.checkpoint_step, j.steps_done) == ("PENDING", 40, 40)
        assert "requeued by the cluster" in j.state_reason and "NodeDown" in j.state_reason
        ex = s.scalars(select(m.JobExecution).where(m.JobExecution.job_id == ids[12])).one()
        assert ex.steps == 40 and ex.solo_equiv_s == pytest.approx(20.0)


def test_a_placed_job_slurm_delays_after_its_release_is_made_eligible_again(env) -> None:
    """Slurm finishes a node-failure requeue after MuxFlow released the job on its new GPU, and pushes the job's begin
    time 2 min ahead then (reason BeginTime): the sync makes it eligible again, once, and leaves the store PLACED.
    A job delayed while MuxFlow believes it runs is Slurm's own requeue: held, not made eligible."""
    store, fake, backend, ids, gpus, _ = env
    _place(store, backend, [(ids[11], gpus[0], 40)])
    fake.jobs[11] = replace(fake.jobs[11], state_reason="BeginTime")  # released (priority 100), not before later
    calls = len(fake.calls)
    rep = backend.sync_jobs(store, W0)
    assert rep.made_eligible == [11] and rep.transitions == {} and not rep.errors
    assert [c for c in fake.calls[calls:] if c[0] == "update_job"] == [("update_job", 11, JobUpdate(eligible_now=True))]
    assert (fake.jobs[11].state_reason, fake.jobs[11].held, _state(store, ids[11])) == ("None", False, "PLACED")
    assert backend.sync_jobs(store, W0).changed == 0  # done once: nothing more to tell Slurm

    _place(store, backend, [(ids[12], gpus[1], 30)], minute=15)
    _start(fake, 12)
    backend.sync_jobs(store, W0)
    fake.jobs[12] = replace(fake.jobs[12], state="PENDING", priority=100, state_reason="BeginTime", nodes=(),
                            end_time_utc=ENDED)
    rep = backend.sync_jobs(store, W0)
    assert rep.held == [12] and rep.made_eligible == [] and _state(store, ids[12]) == "PENDING"


def test_an_eviction_whose_requeue_did_not_take_is_held_then_queued(env) -> None:
    store, fake, backend, ids, gpus, _ = env
    _place(store, backend, [(ids[11], gpus[0], 40)])
    _start(fake, 11)
    backend.sync_jobs(store, W0)
    with store.session() as s:  # the node agent evicted it; its scontrol requeuehold failed
        transition(s, ids[11], JobState.EVICTED, "Overlimit (test)")
    rep = backend.sync_jobs(store, W0)
    assert rep.held == [11] and fake.sent("requeue") and fake.sent("cancel")[-1][2] == "USR1"  # checkpoint first
    assert _state(store, ids[11]) == "PENDING"


def test_a_vanished_job_fails_with_the_reason_and_in_flight_jobs_are_left_to_the_dispatcher(env) -> None:
    store, fake, backend, ids, gpus, _ = env
    _place(store, backend, [(ids[11], gpus[0], 40)])
    del fake.jobs[11]
    # Job 12 has an action in flight in the latest round, still being dispatched.
    result = RoundResult([], [PlanAction(Action.START, ids[12], gpus[1], None, 30)], 0.0, 8, 1, 8)
    with store.session() as s:
        rnd = repo.record_round(s, W0 + dt.timedelta(minutes=15), result, {}, False, 1, {})
        s.add(m.DispatchLog(round_id=rnd.id, action_key="k", action="start", job_id=ids[12], gpu_id=gpus[1]))
    fake.jobs[12] = replace(fake.jobs[12], priority=100)  # released, as the dispatcher is doing
    rep = backend.sync_jobs(store, W0)
    assert rep.skipped_in_flight == 1 and _state(store, ids[12]) == "PENDING"
    with store.session() as s:
        j = s.get(m.OfflineJob, ids[11])
        assert j.state == "FAILED" and "no longer knows" in j.state_reason


def test_a_release_while_the_sync_lists_slurms_jobs_is_left_to_the_dispatcher_not_adopted(env, monkeypatch) -> None:
    """The dispatcher logs its intent and releases the job exactly while the sync asks Slurm for its jobs: the
    sync sees the job running and the store still PENDING. It must leave it to the dispatcher (which books
    PENDING → PLACED → RUNNING with the placement's reason), not adopt it as if nobody had placed it."""
    store, fake, backend, ids, gpus, _ = env
    result = RoundResult([], [PlanAction(Action.START, ids[12], gpus[1], None, 30)], 0.0, 8, 1, 8)
    with store.session() as s:
        rid = repo.record_round(s, W0 + dt.timedelta(minutes=15), result, {}, False, 1, {}).id
    listing = fake.list_jobs

    def list_during_dispatch():
        if not fake.jobs[12].state == "RUNNING":
            with store.session() as s:
                s.add(m.DispatchLog(round_id=rid, action_key="k12", action="start", job_id=ids[12], gpu_id=gpus[1]))
            _start(fake, 12)
        return listing()

    monkeypatch.setattr(fake, "list_jobs", list_during_dispatch)
    rep = backend.sync_jobs(store, W0)
    assert rep.skipped_in_flight == 1 and _state(store, ids[12]) == "PENDING"
    assert ("PENDING", "RUNNING") not in _history(store, ids[12])


def test_a_crash_between_the_hold_and_the_store_write_is_finished_by_the_next_sync(env, monkeypatch) -> None:
    store, fake, backend, ids, gpus, _ = env
    _place(store, backend, [(ids[11], gpus[0], 40)])
    _start(fake, 11)
    backend.sync_jobs(store, W0)
    fake.jobs[11] = replace(fake.jobs[11], state="PENDING", priority=100, nodes=())
    real = slurm_sync._apply

    def crash(*a, **k):
        raise RuntimeError("killed after the hold")

    monkeypatch.setattr(slurm_sync, "_apply", crash)
    with pytest.raises(RuntimeError):
        backend.sync_jobs(store, W0)
    assert fake.jobs[11].held and _state(store, ids[11]) == "RUNNING"
    monkeypatch.setattr(slurm_sync, "_apply", real)
    rep = backend.sync_jobs(store, W0)
    assert rep.transitions == {"PENDING": 1} and rep.held == []  # nothing sent twice
    assert _state(store, ids[11]) == "PENDING"


def test_observe_is_the_sync(env) -> None:
    store, fake, backend, ids, gpus, _ = env
    _place(store, backend, [(ids[11], gpus[0], 40)])
    _start(fake, 11)
    assert backend.observe(store, W0, 15, None) is None
    assert _state(store, ids[11]) == "RUNNING"


def test_slurms_whole_second_start_never_reads_as_before_the_placement(env) -> None:
    store, fake, backend, ids, gpus, _ = env
    placed_at = W0 + dt.timedelta(seconds=60, microseconds=400_000)
    result = RoundResult([PlannedPlacement(ids[11], gpus[0], 40, 2 * 1024**3, 0.5, 0.1)],
                         [PlanAction(Action.START, ids[11], gpus[0], None, 40)], 0.5, 8, 1, 8)
    with store.session() as s:
        rid = repo.record_round(s, W0, result, {}, False, 1, {ids[11]: "start"}).id
    backend.dispatch(store, rid, result, placed_at)
    fake.jobs[11] = replace(fake.jobs[11], state="RUNNING", nodes=("mx-t4-1",),
                            start_time_utc=placed_at.replace(microsecond=0))  # Slurm: whole seconds
    backend.sync_jobs(store, W0)
    with store.session() as s:
        times = [t.at_utc.replace(tzinfo=dt.UTC) for t in s.scalars(
            select(m.JobTransition).where(m.JobTransition.job_id == ids[11]).order_by(m.JobTransition.id))]
    assert times[-2:] == [placed_at, placed_at]  # PLACED, then RUNNING no earlier


def test_a_job_the_user_cancelled_before_it_was_placed_fails_and_a_held_one_is_left_alone(tmp_path: Path) -> None:
    fake = FakeSlurm([make_job(sid, comment=SPEC.format(ckpt=tmp_path / f"c{sid}")) for sid in (21, 22, 23)])
    store = store_with_fake_nodes(tmp_path, fake)
    rep = import_submissions(store, fake, {"ResNet-50 (batch size 64)"}, only=[21, 22, 23])
    ids = dict(zip((21, 22, 23), rep.imported))
    with store.session() as s:
        transition(s, ids[22], JobState.PROFILING, "being profiled")
    fake.cancel(21)  # scancel by its owner while it waited for its profiling
    fake.cancel(22)  # ... and while it was profiled
    backend = SlurmBackend(lambda: fake, plan_key=PLAN_KEY, retry_deadline_s=1.0)
    rep = backend.sync_jobs(store, W0)
    with store.session() as s:
        jobs = {sid: s.get(m.OfflineJob, ids[sid]) for sid in ids}
        assert {sid: j.state for sid, j in jobs.items()} == {21: "FAILED", 22: "FAILED", 23: "SUBMITTED"}
        assert jobs[21].state_reason.startswith("cancelled in the cluster before it was placed (CANCELLED")
    assert _history(store, ids[22])[-1] == ("PROFILING", "FAILED") and rep.held == []
    assert not backend.sync_jobs(store, W0).changed  # settled


def test_a_job_submitted_and_picked_up_while_the_sync_lists_slurms_jobs_is_not_failed_as_absent(
        tmp_path: Path, monkeypatch) -> None:
    """The sync asks Slurm for its jobs, then reads the store again: a job sbatch'ed and picked up in between is
    in the store but not in the older listing. It is new, not gone."""
    fake = FakeSlurm([make_job(21, comment=SPEC.format(ckpt=tmp_path / "c21"))])
    store = store_with_fake_nodes(tmp_path, fake)
    import_submissions(store, fake, {"ResNet-50 (batch size 64)"}, only=[21])
    listing = fake.list_jobs

    def list_then_submit():
        jobs = listing()
        if 22 not in fake.jobs:  # sbatch and pick-up right after Slurm answered
            fake.jobs[22] = make_job(22, comment=SPEC.format(ckpt=tmp_path / "c22"))
            import_submissions(store, fake, {"ResNet-50 (batch size 64)"}, only=[22])
        return jobs

    monkeypatch.setattr(fake, "list_jobs", list_then_submit)
    backend = SlurmBackend(lambda: fake, plan_key=PLAN_KEY, retry_deadline_s=1.0)
    assert not backend.sync_jobs(store, W0).changed
    with store.session() as s:
        assert sorted(j.state for j in s.scalars(select(m.OfflineJob))) == ["SUBMITTED", "SUBMITTED"]
    fake.cancel(22)  # gone for real, and seen so by the next call
    backend.sync_jobs(store, W0)
    with store.session() as s:
        assert s.scalars(select(m.OfflineJob.state).where(m.OfflineJob.slurm_job_id == 22)).one() == "FAILED"


def test_a_placement_booked_while_the_sync_lists_slurms_jobs_is_not_taken_back(env, monkeypatch) -> None:
    """Slurm answers with the job still held; the dispatcher then releases it and books PLACED; the sync's second
    store read sees PLACED. Decided against the older listing it would read as "held again": it is left alone."""
    store, fake, backend, ids, gpus, _ = env
    listing = fake.list_jobs
    placed = []

    def list_then_place():
        jobs = listing()
        if not placed:
            placed.append(True)
            _place(store, backend, [(ids[12], gpus[1], 30)], minute=15)
        return jobs

    monkeypatch.setattr(fake, "list_jobs", list_then_place)
    rep = backend.sync_jobs(store, W0)
    assert rep.moved_meanwhile == 1 and not rep.changed and _state(store, ids[12]) == "PLACED"
    assert ("PLACED", "PENDING") not in _history(store, ids[12])
    monkeypatch.setattr(fake, "list_jobs", listing)
    _start(fake, 12)
    backend.sync_jobs(store, W0)
    assert _state(store, ids[12]) == "RUNNING"


@pytest.mark.parametrize("slurm_state", ["REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "SOMETHING_NEW"])
def test_a_job_seen_while_slurm_requeues_it_is_left_until_it_settles(env, slurm_state) -> None:
    """A listing taken in the middle of a requeue (an eviction's requeue-hold, a migration) shows a state that is
    not an end: the running job is not failed; once Slurm shows it held, it goes back to the queue."""
    store, fake, backend, ids, gpus, _ = env
    _place(store, backend, [(ids[11], gpus[0], 40)])
    _start(fake, 11)
    backend.sync_jobs(store, W0)
    fake.jobs[11] = replace(fake.jobs[11], state=slurm_state)
    assert not backend.sync_jobs(store, W0).changed and _state(store, ids[11]) == "RUNNING"
    fake.jobs[11] = replace(fake.jobs[11], state="PENDING", priority=0, nodes=())
    backend.sync_jobs(store, W0)
    assert _state(store, ids[11]) == "PENDING"


def test_progress_counts_only_the_jobs_users_own_checkpoints(tmp_path: Path) -> None:
    """``ckpt=`` is the user's to write: a link, another user's directory or files, or a huge directory are no
    progress (MuxFlow lists names there, and follows no link a user sets)."""
    import os

    from executors.scheduler.slurm.sync import MAX_CHECKPOINT_ENTRIES, _newest_checkpoint
    from tests.executors.scheduler.slurm.fake_slurm import USER

    mine = tmp_path / "mine"
    CheckpointStore(mine).save(40, {"loss": 1.0})
    assert _newest_checkpoint(str(mine), USER) == 40
    assert _newest_checkpoint(str(mine), None) is None and _newest_checkpoint(str(mine), "no-such-user-x") is None
    link = tmp_path / "link"
    link.symlink_to(mine)
    assert _newest_checkpoint(str(link), USER) is None
    (mine / "ckpt-000000009999.mxck").symlink_to(mine / "ckpt-000000000040.mxck")
    assert _newest_checkpoint(str(mine), USER) == 40  # a linked "checkpoint" is not one
    if os.geteuid() == 0:
        os.chown(mine / "ckpt-000000000040.mxck", 65534, 65534)
        assert _newest_checkpoint(str(mine), USER) is None  # another user's file
        os.chown(mine, 65534, 65534)
        assert _newest_checkpoint(str(mine), USER) is None  # another user's directory
    big = tmp_path / "big"
    big.mkdir()
    for i in range(MAX_CHECKPOINT_ENTRIES + 1):
        (big / f"f{i}").touch()
    assert _newest_checkpoint(str(big), USER) is None
