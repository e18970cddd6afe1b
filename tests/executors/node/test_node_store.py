"""The node agent against the feature store (SQLite and Postgres): health, evictions, device errors, minutes."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from executors.node.agent import AgentConfig
from executors.node.sampler import RawSample, SimulatedSampler
from executors.node.wiring import build_agent, node_gpus
from executors.store import models as m

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc).timestamp()
CALM = RawSample(40.0, 30.0, 15.0, 6e9, 24e9, 10.0, 1600.0, 1700.0, 120.0, 55.0)
HOT = RawSample(99.0, 99.0, 60.0, 6e9, 24e9, 10.0, 1600.0, 1700.0, 250.0, 75.0)


class FakeClock:
    def __init__(self) -> None:
        self.t = T0

    def epoch(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t - T0


def _agent(store, sampler, clock, evicted, tmp_path):
    job_id = 1

    def cb(gpu_id, reason):
        evicted.append((gpu_id, reason))
        return [job_id]

    return build_agent(store, "sim-a10-000", simulated=True, cfg=AgentConfig(interval_s=1.0), shm_dir=tmp_path,
                       evict_callback=cb, sampler=sampler, clock=clock)


def test_agent_writes_health_evictions_errors_and_minutes(cluster_store, tmp_path):
    store = cluster_store
    pairs = node_gpus(store, "sim-a10-000")
    assert len(pairs) == 8
    gid0 = pairs[0][0].id
    sampler = SimulatedSampler(replay={g.gpu_index: [CALM] for g, _ in pairs})
    sampler.add_xid(T0 + 70, 1, 31)
    clock, evicted = FakeClock(), []
    agent = _agent(store, sampler, clock, evicted, tmp_path)
    for k in range(90):
        sampler.set_override(0, HOT if k == 65 else CALM)
        agent.tick()
        clock.t += 1.0
    agent.shutdown()
    with store.session() as s:
        gpus = {g.gpu_index: g for g, _ in node_gpus(store, "sim-a10-000")}
        assert gpus[0].health == "Overlimit" and len(gpus[0].overlimit_entries) == 1
        assert all(gpus[i].health == "Healthy" for i in range(2, 8))
        ev = s.scalars(select(m.Eviction).order_by(m.Eviction.id)).all()
        assert [(e.gpu_id, e.job_id, e.health, e.source) for e in ev] == [
            (gid0, 1, "Overlimit", "simulated"), (gpus[1].id, 1, "Init", "simulated")]
        (err,) = s.scalars(select(m.DeviceError)).all()
        assert (err.gpu_id, err.kind, err.xid, err.source) == (gpus[1].id, "xid", 31, "simulated")
        rows = s.scalars(select(m.GpuMetricMinute).order_by(m.GpuMetricMinute.minute_utc, m.GpuMetricMinute.gpu_id)).all()
        assert len(rows) == 16 and {r.source for r in rows} == {"simulated"}
        first = [r for r in rows if r.gpu_id == gid0]
        assert first[0].sm_activity_pct == 30.0 and first[0].health == "Healthy"
        assert first[1].health == "Overlimit" and first[1].power_w > 120.0
    assert len(evicted) == 2


def test_restart_keeps_backoff_and_existing_minutes(cluster_store, tmp_path):
    store = cluster_store
    pairs = node_gpus(store, "sim-a10-000")
    sampler = SimulatedSampler(replay={g.gpu_index: [CALM] for g, _ in pairs})
    clock, evicted = FakeClock(), []
    agent = _agent(store, sampler, clock, evicted, tmp_path)
    sampler.set_override(0, HOT)
    agent.tick()
    clock.t += 1.0
    agent.shutdown()
    # a second agent in the same minute: the stored Overlimit entry is restored, the minute row kept
    sampler2 = SimulatedSampler(replay={g.gpu_index: [CALM] for g, _ in pairs})
    agent2 = _agent(store, sampler2, clock, evicted, tmp_path)
    mon = agent2.loops[0].monitor
    assert mon.overlimit_entries_s == [T0]
    assert mon.hold_period_s(T0 + 10) == 60.0
    agent2.tick()
    agent2.shutdown()
    with store.session() as s:
        assert s.query(m.GpuMetricMinute).count() == 8


def _dispatched_round(s, window: dt.datetime, placements: list[tuple[int, int]], status: str = "dispatched") -> None:
    rnd = m.SchedulingRound(window_start_utc=window, status=status)
    s.add(rnd)
    s.flush()
    for job_id, gpu_id in placements:
        s.add(m.Placement(round_id=rnd.id, job_id=job_id, gpu_id=gpu_id, sm_pct=40, mem_quota_bytes=1 << 30,
                          predicted_norm_tput=0.5, predicted_online_slowdown=0.1, action="start"))


def test_jobs_on_gpu_follow_the_latest_dispatched_round(cluster_store):
    from executors.node.evictor import SlurmEvictor, store_jobs_on_gpu

    store = cluster_store
    g1, g2 = [g.id for g, _ in node_gpus(store, "sim-a10-000")[:2]]
    w = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    with store.session() as s:
        jobs = s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id)).all()
        for j, sid in zip(jobs[:3], (9001, 9002, None)):
            j.state, j.slurm_job_id = "RUNNING", sid
        _dispatched_round(s, w, [(jobs[0].id, g1)])
        # the next round moved job 0 to g2 and put job 2 (no Slurm id) on g1; job 1 (running) is placed
        # nowhere; a later planned round is not dispatched yet
        _dispatched_round(s, w + dt.timedelta(minutes=15), [(jobs[0].id, g2), (jobs[2].id, g1)])
        _dispatched_round(s, w + dt.timedelta(minutes=30), [(jobs[0].id, g1)], status="planned")
        ids = [j.id for j in jobs]
    assert store_jobs_on_gpu(store)(g1) == []
    assert store_jobs_on_gpu(store, with_slurm_id=False)(g1) == [(ids[2], None)]
    assert store_jobs_on_gpu(store)(g2) == [(ids[0], 9001)]
    requeued = []
    out = SlurmEvictor(store_jobs_on_gpu(store), requeued.append).evict(g2, "Overlimit")
    assert requeued == [9001] and [e.job_id for e in out] == [ids[0]]


def test_store_writer_batches_without_losing_good_events_to_a_bad_one(cluster_store):
    from executors.node.agent import DeviceErrorEvent, StoreSink

    store = cluster_store
    gid = node_gpus(store, "sim-a10-000")[0][0].id
    at = dt.datetime.fromtimestamp(T0, tz=dt.timezone.utc)
    sink = StoreSink(store, "simulated")
    for k in range(40):
        sink.device_error(DeviceErrorEvent(gid, at + dt.timedelta(seconds=k), "xid", 31, f"event {k}"))
        if k == 17:  # kind is required: this one cannot be stored
            sink.device_error(DeviceErrorEvent(gid, at, None, None, "bad"))
    sink.close()
    assert sink.errors == 1
    with store.session() as s:
        details = sorted(e.detail for e in s.scalars(select(m.DeviceError)))
    assert details == sorted(f"event {k}" for k in range(40))
