"""Fills: waiting jobs started on GPUs that freed up after a round, nothing running moved (SQLite and Postgres).

A real round plans the window on the simulated cluster's store; the fills then run against a cluster that starts
jobs later (as Slurm does), whose running jobs the test sets: which GPUs are free is the cluster's word.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest
from sqlalchemy import func, select

from executors.cluster import DispatchResult, JobSyncReport, RunningJob
from executors.data.calibration import default_catalog
from executors.scheduler import predictors, round_runner
from executors.scheduler.round_service import RoundError, RoundService
from executors.scheduler.submission import JobSpec, submit
from executors.simulated import profiler
from executors.simulated.backend import SimulatedBackend
from executors.store import models as m
from executors.store import rounds as rounds_db
from executors.store.db import Store
from executors.store.jobs import transition
from scheduler_core.domain import Action, JobState
from scheduler_core.prediction.predictor import PredictorConfig
from scheduler_core.round.clock import RoundClock
from scheduler_core.round.plan import RoundConfig

WINDOW = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.timezone.utc)


@dataclass
class LaterCluster:
    """A cluster that starts released jobs later (Slurm's way): the test says what runs where."""

    jobs: dict[int, RunningJob] = field(default_factory=dict)
    sent: list = field(default_factory=list)
    simulated: bool = False

    def running(self) -> dict[int, RunningJob]:
        return dict(self.jobs)

    def dispatch(self, actions, now):
        self.sent.extend(actions)
        for a in actions:
            self.jobs[a.job_id] = RunningJob(a.job_id, a.gpu_id, a.sm_pct)
        return [DispatchResult(a, True, "released") for a in actions]


@dataclass
class LaterBackend:
    cluster_: LaterCluster
    simulated: bool = False

    def cluster(self, store: Store) -> LaterCluster:
        return self.cluster_

    def sync_jobs(self, store: Store, now: dt.datetime) -> JobSyncReport:
        return JobSyncReport()

    def dispatch(self, store: Store, round_id: int, result, now: dt.datetime) -> tuple[int, int]:
        return round_runner.dispatch_round(store, self.cluster_, round_id, result, now)


@pytest.fixture
def after_a_round(cluster_store: Store):
    """The 6 jobs placed by a dispatched round on 16 GPUs; the cluster knows them where the round put them."""
    store = cluster_store
    profiler.profile_new_jobs(store, default_catalog())
    profiler.collect_samples(store, default_catalog(), 200, 0)
    predictors.train_predictors(store, PredictorConfig(epochs=60))
    svc = RoundService(store, SimulatedBackend(), RoundConfig(), RoundClock())
    out = svc.run_once(WINDOW)
    placed = {p.job_id: RunningJob(p.job_id, p.gpu_id, p.sm_pct) for p in out.planned.result.placements}
    assert len(placed) >= 4
    return store, LaterCluster(placed)


def _submit_and_profile(store: Store, n: int) -> list[int]:
    """``n`` more long jobs of a type the round placed (so a free GPU can take them), profiled: PENDING."""
    with store.session() as s:
        placed = s.scalars(select(m.OfflineJob).where(m.OfflineJob.state == JobState.RUNNING.value)
                           .order_by(m.OfflineJob.id)).first()
        seen = s.scalar(select(func.count()).select_from(m.OfflineJob))
        ids = [submit(s, JobSpec(name=f"late-{seen}-{k}", command="python train.py", job_type=placed.job_type,
                                 mem_bytes=placed.mem_bytes, allowed_gpu_types=tuple(placed.allowed_gpu_types),
                                 checkpoint_dir=f"/ckpt/late{k}", total_steps=placed.total_steps), None).id
               for k in range(n)]
    profiler.profile_new_jobs(store, default_catalog())
    return ids


def _waiting(store: Store) -> set[int]:
    with store.session() as s:
        return {j.id for j in s.scalars(select(m.OfflineJob).where(m.OfflineJob.state == JobState.PENDING.value))}


def test_a_fill_starts_the_jobs_that_arrived_on_free_gpus_and_moves_nothing(after_a_round) -> None:
    store, cluster = after_a_round
    busy = {r.gpu_id for r in cluster.jobs.values()}
    left_out = _waiting(store)  # the round's unplaced jobs wait too
    new = _submit_and_profile(store, 2)
    out = RoundService(store, LaterBackend(cluster)).fill(WINDOW + dt.timedelta(minutes=4))
    f = out.fill
    assert (f.seq, f.free_gpus, f.waiting_jobs) == (1, 16 - len(busy), 2 + len(left_out))
    started = {a.job_id for a in f.result.actions}
    assert set(new) <= started <= set(new) | left_out and out.sent_ok == len(started)
    assert {a.action for a in f.result.actions} == {Action.START}
    assert not {a.gpu_id for a in f.result.actions} & busy  # only GPUs with no offline job
    with store.session() as s:
        row = s.get(m.SchedulingRound, f.round_id)
        assert (row.window_start_utc, row.seq, row.status) == (WINDOW, 1, "dispatched")
        assert row.snapshot["fill_of_round"] == rounds_db.round_for_window(s, WINDOW).id
        assert {s.get(m.OfflineJob, j).state for j in new} == {"PLACED"}
        assert rounds_db.latest_round(s).seq == 0 and rounds_db.round_for_window(s, WINDOW).seq == 0
    # Nothing new: the next fill starts nothing, and stores nothing unless a job still waits.
    again = RoundService(store, LaterBackend(cluster)).fill(WINDOW + dt.timedelta(minutes=5)).fill
    assert again.waiting_jobs == len(left_out - started)
    assert again.round_id is None or not again.result.actions


def test_jobs_a_fill_started_are_where_the_fill_put_them_for_the_node_agents(after_a_round) -> None:
    store, cluster = after_a_round
    (new,) = _submit_and_profile(store, 1)
    f = RoundService(store, LaterBackend(cluster)).fill(WINDOW + dt.timedelta(minutes=4)).fill
    start = next(a for a in f.result.actions if a.job_id == new)
    with store.session() as s:
        for j in [*cluster.jobs]:
            if s.get(m.OfflineJob, j).state == JobState.PLACED.value:
                transition(s, j, JobState.RUNNING, "started in the cluster")
    with store.session() as s:
        seen = {r.job_id: (r.gpu_id, r.sm_pct) for r in rounds_db.running_in_latest_dispatch(
            s, [g.id for g in s.scalars(select(m.Gpu))])}
    assert seen[new] == (start.gpu_id, start.sm_pct)
    assert {j: (r.gpu_id, r.sm_pct) for j, r in cluster.jobs.items()} == seen  # the round's jobs as placed


def test_a_gpu_freed_by_a_finished_job_takes_a_waiting_one(after_a_round) -> None:
    store, cluster = after_a_round
    free = 16 - len({r.gpu_id for r in cluster.jobs.values()})
    many = _submit_and_profile(store, free + 2)  # more than the free GPUs
    first = RoundService(store, LaterBackend(cluster)).fill(WINDOW + dt.timedelta(minutes=2))
    unfit = free - first.sent_ok  # free GPUs whose service the job type would slow too much
    assert 0 < first.sent_ok <= free and first.fill.waiting_jobs >= len(many)
    left = sorted(set(many) - {a.job_id for a in first.fill.result.actions})
    with store.session() as s:  # a job of the same type finishes: its GPU can take one of the left
        kind = s.get(m.OfflineJob, many[0]).job_type
        done = next(j for j in sorted(cluster.jobs) if j not in many and s.get(m.OfflineJob, j).job_type == kind)
    freed = cluster.jobs.pop(done).gpu_id
    second = RoundService(store, LaterBackend(cluster)).fill(WINDOW + dt.timedelta(minutes=7)).fill
    assert second.seq == 2 and second.free_gpus == 1 + unfit
    (a,) = second.result.actions
    assert a.gpu_id == freed and a.job_id in left


def test_an_undispatched_fill_is_sent_again_not_planned_again(after_a_round) -> None:
    store, cluster = after_a_round
    _submit_and_profile(store, 1)
    planned = round_runner.plan_fill(store, cluster, WINDOW + dt.timedelta(minutes=3))  # the dispatch then died
    out = RoundService(store, LaterBackend(cluster)).fill(WINDOW + dt.timedelta(minutes=4))
    assert out.fill.round_id == planned.round_id and out.sent_ok == len(planned.result.actions) >= 1
    with store.session() as s:
        assert s.get(m.SchedulingRound, planned.round_id).status == "dispatched"
        assert s.scalar(select(func.count()).select_from(m.SchedulingRound)) == 2


def test_a_fill_left_undispatched_for_more_than_a_period_is_dropped_and_planned_again(after_a_round) -> None:
    store, cluster = after_a_round
    (new,) = _submit_and_profile(store, 1)
    planned_at = WINDOW + dt.timedelta(minutes=3)
    old = round_runner.plan_fill(store, cluster, planned_at)  # its dispatch died; Slurm answers again 16 min later
    out = RoundService(store, LaterBackend(cluster)).fill(planned_at + dt.timedelta(minutes=16))
    assert out.fill.round_id != old.round_id and out.fill.seq == 2
    assert new in {a.job_id for a in out.fill.result.actions}
    with store.session() as s:
        assert s.get(m.SchedulingRound, old.round_id).status == "failed"


def test_a_fill_needs_a_dispatched_round_and_a_real_cluster(cluster_store: Store) -> None:
    with pytest.raises(RoundError, match="fills run on a real cluster"):
        RoundService(cluster_store, SimulatedBackend()).fill(WINDOW)
    profiler.profile_new_jobs(cluster_store, default_catalog())
    profiler.collect_samples(cluster_store, default_catalog(), 200, 0)
    predictors.train_predictors(cluster_store, PredictorConfig(epochs=5))
    with pytest.raises(RoundError, match="no dispatched round to follow"):
        RoundService(cluster_store, LaterBackend(LaterCluster())).fill(WINDOW)
    RoundService(cluster_store, SimulatedBackend()).plan(WINDOW)  # planned, not dispatched
    with pytest.raises(RoundError, match="is not dispatched yet"):
        RoundService(cluster_store, LaterBackend(LaterCluster())).fill(WINDOW)
