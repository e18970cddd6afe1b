"""START, MIGRATE and EVICT against the stateful fake slurmrestd, on a fake clock, and a dispatcher killed after
every one of its changes to Slurm and run again: each time the end state is the uninterrupted one (no Slurm change
twice, no action lost). Milliseconds; the live crash test (tests/live/test_dispatch_live.py) keeps what only a
real slurmctld shows."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.scheduler.slurm.backend import SlurmBackend, SlurmCluster
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm.retry import Retry, SlurmUnavailable
from executors.store import models as m
from executors.store import repo
from executors.store.jobs import transition
from scheduler_core.domain import Action, JobState, PlanAction, PlannedPlacement, RoundResult
from tests.executors.scheduler.slurm.fake_slurm import PLAN_KEY, FakeClock, FakeSlurm, make_job, store_with_fake_nodes

SPEC = "muxflow: type=x mem=1GiB gpu-types=t4,a10 ckpt=/ckpt/{n} steps=100"
NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
READS = {"get_job", "list_jobs", "list_nodes"}


class Killed(BaseException):
    """The dispatcher's process dies (not an error it could handle)."""


class DyingSlurm(FakeSlurm):
    """The fake slurmrestd; the dispatcher dies right after its ``die_after``-th change to Slurm went through."""

    die_after: int | None = None

    def _call(self, *what) -> None:
        super()._call(*what)
        self.changes = getattr(self, "changes", 0) + (what[0] not in READS)

    def _maybe_die(self) -> None:
        if self.die_after is not None and getattr(self, "changes", 0) >= self.die_after:
            raise Killed

    def update_job(self, job_id, update):
        super().update_job(job_id, update)
        self._maybe_die()

    def cancel(self, job_id, signal=None):
        super().cancel(job_id, signal)
        self._maybe_die()

    def requeue(self, job_id, hold=True):
        super().requeue(job_id, hold)
        self._maybe_die()


def _setup(tmp_path: Path):
    """Three jobs: 11 pending, 12 running on mx-a10-1 GPU 1, 13 running on mx-a10-1 GPU 3."""
    fake = DyingSlurm([make_job(sid, comment=SPEC.format(n=sid)) for sid in (11, 12, 13)])
    store = store_with_fake_nodes(tmp_path, fake)
    rep = import_submissions(store, fake, None, only=[11, 12, 13])
    with store.session() as s:
        ids = {j.slurm_job_id: j.id for j in s.scalars(select(m.OfflineJob))}
        gpu = {(g.node.name, g.gpu_index): g.id for g in s.scalars(select(m.Gpu))}
        for j in rep.imported:
            for st in (JobState.PROFILING, JobState.PENDING):
                transition(s, j, st, "setup")
    clock = FakeClock()
    backend = SlurmBackend(lambda: fake, plan_key=PLAN_KEY, retry_deadline_s=5)
    first = [(ids[12], gpu[("mx-a10-1", 1)], 40), (ids[13], gpu[("mx-a10-1", 3)], 30)]
    _dispatch(store, backend, clock, first, [], minute=0)
    for sid, node in ((12, "mx-a10-1"), (13, "mx-a10-1")):  # Slurm starts them
        fake.jobs[sid] = replace(fake.jobs[sid], state="RUNNING", nodes=(node,), start_time_utc=NOW)
    with store.session() as s:
        for sid in (12, 13):
            transition(s, ids[sid], JobState.RUNNING, "started")
    actions = [PlanAction(Action.START, ids[11], gpu[("mx-t4-1", 0)], None, 35),
               PlanAction(Action.MIGRATE, ids[12], gpu[("mx-t4-1", 2)], gpu[("mx-a10-1", 1)], 50),
               PlanAction(Action.EVICT, ids[13], None, gpu[("mx-a10-1", 3)], None)]
    return fake, store, backend, clock, ids, actions


def _dispatch(store, backend, clock, starts, actions, minute: int) -> int:
    placements = [PlannedPlacement(j, g, p, 2 * 1024**3, 0.5, 0.1) for j, g, p in starts]
    acts = [PlanAction(Action.START, j, g, None, p) for j, g, p in starts] + list(actions)
    result = RoundResult(placements, acts, 0.5, 8, len(acts), 8)
    with store.session() as s:
        rid = repo.record_round(s, NOW + dt.timedelta(minutes=minute), result, {}, False, len(acts),
                                {j: "start" for j, _, _ in starts}).id
    _send(store, backend, clock, rid, result)
    return rid


def _send(store, backend, clock, rid, result):
    cluster = SlurmCluster(store, backend.client_factory(), plan_key=PLAN_KEY, retry=Retry(5, sleep=clock.sleep, clock=clock), round_id=rid)
    from executors.scheduler import round_runner

    return round_runner.dispatch_round(store, cluster, rid, result, NOW)


def _end_state(fake, store, ids) -> tuple:
    slurm = {sid: (j.state, j.priority == 0, j.required_nodes, j.gres_per_node, j.comment)
             for sid, j in fake.jobs.items()}
    with store.session() as s:
        jobs = {sid: s.get(m.OfflineJob, jid).state for sid, jid in ids.items()}
        log = sorted((r.action, r.job_id, r.status) for r in s.scalars(select(m.DispatchLog)))
    return slurm, jobs, log


def test_migrate_checkpoints_requeues_and_places_evict_checkpoints_and_holds(tmp_path: Path) -> None:
    fake, store, backend, clock, ids, actions = _setup(tmp_path)
    _dispatch(store, backend, clock, [], actions, minute=15)
    slurm, jobs, log = _end_state(fake, store, ids)
    # START: released on mx-t4-1; MIGRATE: USR1 (checkpoint), requeue held, placed on mx-t4-1; EVICT: held.
    assert slurm[11][:3] == ("PENDING", False, ("mx-t4-1",)) and "mps:35" in slurm[11][3]
    assert slurm[12][:3] == ("PENDING", False, ("mx-t4-1",)) and "mps:50" in slurm[12][3]
    assert slurm[13][:2] == ("PENDING", True)
    assert ("cancel", 12, "USR1") in fake.calls and ("cancel", 13, "USR1") in fake.calls
    assert ("requeue", 12, True) in fake.calls and ("requeue", 13, True) in fake.calls
    assert jobs == {11: "PLACED", 12: "PLACED", 13: "PENDING"}
    assert {status for *_, status in log} == {"done"}


def test_a_dispatcher_killed_after_any_change_to_slurm_finishes_on_restart_exactly_as_an_uninterrupted_one(
        tmp_path: Path) -> None:
    fake, store, backend, clock, ids, actions = _setup(tmp_path / "reference")
    before = fake.changes
    _dispatch(store, backend, clock, [], actions, minute=15)
    reference = _end_state(fake, store, ids)
    changes = fake.changes - before
    assert changes >= 6  # START 1; MIGRATE signal, requeue, place; EVICT signal, requeue
    for k in range(1, changes + 1):
        fake, store, backend, clock, ids, actions = _setup(tmp_path / f"kill{k}")
        fake.die_after = fake.changes + k
        with pytest.raises(Killed):
            _dispatch(store, backend, clock, [], actions, minute=15)
        fake.die_after = None
        with store.session() as s:  # the restarted dispatcher finds the round the killed one left
            rnd = s.scalars(select(m.SchedulingRound).order_by(m.SchedulingRound.id.desc())).first()
            pending = [r.status for r in s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == rnd.id))]
            result = RoundResult([], actions, 0.5, 8, len(actions), 8)
        assert rnd.status == "planned" and set(pending) <= {"intent", "sent"}, (k, pending)
        _send(store, backend, clock, rnd.id, result)
        assert _end_state(fake, store, ids) == reference, f"killed after change {k}"


def test_slurm_down_for_longer_than_the_deadline_leaves_the_plan_pending_without_waiting_for_real(
        tmp_path: Path) -> None:
    fake, store, backend, clock, ids, actions = _setup(tmp_path)
    fake.down = True
    with pytest.raises(SlurmUnavailable):
        _dispatch(store, backend, clock, [], actions, minute=15)
    # Backed off on the fake clock only, doubling, and gave up before the next wait would pass the 5 s deadline.
    assert clock.slept == [0.2, 0.4, 0.8, 1.6] and clock.t == pytest.approx(3.0)
    with store.session() as s:
        rnd = s.scalars(select(m.SchedulingRound).order_by(m.SchedulingRound.id.desc())).first()
        log = {r.status for r in s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == rnd.id))}
    assert rnd.status == "planned" and log == {"intent"}
