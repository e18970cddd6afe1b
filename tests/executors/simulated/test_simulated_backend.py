"""The simulated cluster across processes: its state survives export/import exactly, windows go in order;
several jobs share a GPU within 100 % of its SMs."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from sqlalchemy import func, select

from executors.data.calibration import default_catalog
from executors.simulated.backend import ObservationOrderError, SimulatedBackend
from executors.simulated.cluster import SimGpuSpec, SimJobSpec, SimServiceSpec, SimSettings, SimulatedCluster
from executors.simulated.setup import observed_until
from executors.store import models as m
from executors.store.db import Store
from scheduler_core.domain import Action, PlanAction

T0 = dt.datetime(2026, 1, 5, 18, 0, tzinfo=dt.timezone.utc)
JOBS = [SimJobSpec(1, "ResNet-50 (batch size 64)", 10_000_000), SimJobSpec(2, "LM (batch size 20)", 10_000_000),
        SimJobSpec(3, "Transformer (batch size 32)", 10_000_000)]


def new_cluster() -> SimulatedCluster:
    svc = SimServiceSpec("svc-rec", "recommender", 40.0, 190.0, 18.0, 6 * 1024**3)
    cnn = SimServiceSpec("svc-cnn", "cnn", 30.0, 150.0, 20.0, 3 * 1024**3)
    gpus = [SimGpuSpec(i, "t4" if i < 3 else "a10", svc if i % 2 else cnn) for i in range(1, 6)]
    c = SimulatedCluster(gpus, default_catalog(), SimSettings(seed=3, burst_prob_per_min=0.05))
    for j in JOBS:
        c.register_job(j)
    return c


def as_json(report) -> str:
    from dataclasses import asdict

    return json.dumps({"metrics": [asdict(r) for r in report.metrics],
                       "executions": [asdict(e) for e in report.executions],
                       "evictions": [asdict(e) for e in report.evictions],
                       "progress": report.progress, "health": report.health,
                       "completed": report.completed}, default=str, sort_keys=True)


def test_exported_state_continues_exactly_like_the_original() -> None:
    a = new_cluster()
    a.advance(T0 - dt.timedelta(hours=1), 60)
    a.dispatch([PlanAction(Action.START, 1, 1, None, 60), PlanAction(Action.START, 2, 4, None, 45)], T0)
    a.advance(T0, 15)
    # A migration leaves an unreported execution behind until the next window.
    a.dispatch([PlanAction(Action.MIGRATE, 1, 2, 1, 50), PlanAction(Action.START, 3, 5, None, 70)],
               T0 + dt.timedelta(minutes=15))
    state = json.loads(json.dumps(a.export_state()))  # what the store keeps
    assert state["pending_execs"], "the migration's closed execution is part of the state"
    b = new_cluster()
    b.load_state(state)
    assert b.running() == a.running()
    for k in range(3):
        start = T0 + dt.timedelta(minutes=15 * (k + 1))
        assert as_json(a.advance(start, 15)) == as_json(b.advance(start, 15))
    assert a.export_state() == b.export_state()


def test_state_drops_a_job_no_longer_live_and_refuses_other_versions(caplog) -> None:
    a = new_cluster()
    a.dispatch([PlanAction(Action.START, 1, 1, None, 60), PlanAction(Action.START, 2, 2, None, 60)], T0)
    state = a.export_state()
    # Job 1 was cancelled (FAILED in the store) while another process simulated the cluster: not registered.
    other = SimulatedCluster([SimGpuSpec(i, "t4", SimServiceSpec("s", "cnn", 30, 150, 20, 1)) for i in (1, 2)],
                             default_catalog())
    other.register_job(JOBS[1])
    other.load_state(state)
    assert set(other.running()) == {2}
    assert "runs job 1, which the store no longer lists as live: dropped" in caplog.text
    with pytest.raises(ValueError, match="state version"):
        new_cluster().load_state({**state, "version": 99})


def test_two_jobs_share_a_gpu_each_slower_than_alone_and_a_third_that_does_not_fit_is_refused() -> None:
    def steps(actions) -> tuple[dict, object]:
        c = new_cluster()
        c.advance(T0 - dt.timedelta(hours=1), 60)
        results = c.dispatch(actions, T0)
        assert all(r.ok for r in results), [r.detail for r in results]
        report = c.advance(T0, 15)
        return {j: p[0] for j, p in report.progress.items()}, report

    alone, _ = steps([PlanAction(Action.START, 1, 1, None, 40)])
    together, report = steps([PlanAction(Action.START, 1, 1, None, 40), PlanAction(Action.START, 2, 1, None, 45)])
    assert 0 < together[1] < alone[1] and together[2] > 0
    rows = [r for r in report.metrics if r.gpu_id == 1]
    assert {r.offline_job_id for r in rows} == {2}  # of several, the job with the largest share
    c = new_cluster()
    c.dispatch([PlanAction(Action.START, 1, 1, None, 40), PlanAction(Action.START, 2, 1, None, 45)], T0)
    (refused,) = c.dispatch([PlanAction(Action.START, 3, 1, None, 20)], T0)
    assert not refused.ok and "no room for 20 %" in refused.detail
    assert set(c.running()) == {1, 2}


def test_backend_observes_windows_in_order_and_once(cluster_store: Store) -> None:
    backend = SimulatedBackend()
    assert backend.ensure_history(cluster_store, T0) == 60
    assert backend.ensure_history(cluster_store, T0) == 0  # history exists
    with cluster_store.session() as s:
        assert observed_until(s) == T0
    assert backend.observe(cluster_store, T0, 15, None) is not None
    assert backend.observe(cluster_store, T0, 15, None) is None  # booked before
    with pytest.raises(ObservationOrderError):
        backend.observe(cluster_store, T0 + dt.timedelta(minutes=10), 15, None)
    # A gap without rounds is simulated before the next window.
    later = T0 + dt.timedelta(minutes=45)
    assert backend.observe(cluster_store, later, 15, None) is not None
    with cluster_store.session() as s:
        assert observed_until(s) == later + dt.timedelta(minutes=15)
        minutes = s.scalar(select(func.count(func.distinct(m.GpuMetricMinute.minute_utc))))
    assert minutes == 60 + 15 + 30 + 15  # warm-up, window, the 30-minute gap, window
    # Before planning a window, the history is brought up to its start.
    assert backend.ensure_history(cluster_store, later + dt.timedelta(minutes=45)) == 30
    # After more than a day without rounds only the last hour is simulated.
    far = later + dt.timedelta(days=3)
    assert backend.ensure_history(cluster_store, far) == 60
    with cluster_store.session() as s:
        assert observed_until(s) == far
