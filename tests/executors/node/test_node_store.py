"""The node agent against the feature store (SQLite and Postgres): health, evictions, device errors, minutes."""

from __future__ import annotations

import datetime as dt

import pytest
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
    from executors.node.agent import DeviceErrorEvent
    from executors.node.store_sink import StoreSink

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


# -- online columns, the minute in progress, evictions moving the job -----------------------------

def _wait(what: str, check, timeout_s: float = 20.0):
    import time

    end = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a real condition (the writer thread's progress), not a race
    return value


def _running(s, job_id: int, slurm_id: int, to: str = "RUNNING") -> None:
    from executors.store.jobs import transition
    from scheduler_core.domain import JobState

    for st in ("PROFILING", "PENDING", *(() if to == "PENDING" else (to,))):
        transition(s, job_id, JobState(st), "test")
    s.get(m.OfflineJob, job_id).slurm_job_id = slurm_id


def test_a_burst_evicts_the_slurm_job_which_the_store_shows_evicted_with_online_rows(cluster_store, tmp_path):
    """Endpoint registered on GPU 0 (a real reference endpoint), a RUNNING Slurm job on GPU 0 and a job the
    store no longer has RUNNING on GPU 1; the minute in progress is written every 10 s."""
    from executors.data.calibration import default_catalog
    from executors.job.workloads.endpoint import Endpoint, ServeMetrics, TargetQps
    from executors.node.placements import OfflineOnGpu, StaticPlacements
    from executors.node.wiring import SourceConfig

    store = cluster_store
    pairs = node_gpus(store, "sim-t4-000")
    g0, g1 = pairs[0][0].id, pairs[1][0].id
    target = TargetQps(10.0)
    metrics = ServeMetrics("cnn", "tiny", "cpu", target)
    endpoint = Endpoint(metrics, target).start()
    traits = default_catalog().offline["ResNet-50 (batch size 64)"].traits
    with store.session() as s:
        inst = s.scalars(select(m.ServiceInstance).where(m.ServiceInstance.gpu_id == g0)).one()
        inst.metrics_url = endpoint.url
        inst.service.model_family = "cnn"
        j1, j2 = [j.id for j in s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id)).all()[:2]]
        _running(s, j1, 9001)
        _running(s, j2, 9002, to="PENDING")  # the job-state sync requeued it meanwhile
    placements = StaticPlacements({0: (OfflineOnGpu(j1, 9001, 70, 2 << 30, traits, T0),),
                                   1: (OfflineOnGpu(j2, 9002, 70, 2 << 30, traits, T0),)})
    requeued: list[int] = []
    clock = FakeClock()
    agent = build_agent(store, "sim-t4-000", simulated=True, cfg=AgentConfig(interval_s=1.0, partial_every_s=10.0),
                        shm_dir=None, requeue=requeued.append, clock=clock, placements=placements,
                        sources=SourceConfig(placements="none", scrape_s=3600.0, noise_pct=0.0,
                                             sim_xcuda_target_util=None))  # jobs xCUDA does not pace
    scraper = agent.loops[0].accounting.scrapers.get(0)
    try:
        _wait("the first scrape", lambda: scraper.scrapes + scraper.failures)

        def run(seconds: int, qps: float) -> None:
            for _ in range(seconds):
                metrics.on_batch([0.0] * int(qps), 0.0, 0.01)  # qps requests of 10 ms each second
                if int(clock.t - T0) % 5 == 0:
                    assert scraper.scrape_once()
                agent.tick()
                clock.t += 1.0

        run(25, 10.0)
        with store.session() as s:  # a row of another writer for GPU 1's minute 1: kept, never replaced
            s.add(m.GpuMetricMinute(gpu_id=g1, minute_utc=dt.datetime.fromtimestamp(T0 + 60, dt.timezone.utc),
                                    gpu_util_pct=1.0, sm_activity_pct=1.0, sm_occupancy_pct=0.0, mem_used_bytes=1.0,
                                    mem_total_bytes=2.0, sm_clock_mhz=1.0, health="Healthy", source="simulated"))

        def early():
            with store.session() as s:
                return s.scalars(select(m.GpuMetricMinute).where(m.GpuMetricMinute.gpu_id == g0)).all()

        (row,) = _wait("the minute in progress in the store", early)
        assert row.online_qps == pytest.approx(10.0) and row.offline_job_id == j1 and row.source == "simulated"
        run(40, 10.0)  # minute 0 closes at 10 QPS
        target.set(250.0)
        run(30, 250.0)
    finally:
        agent.shutdown()
        endpoint.close()
    assert sorted(requeued) == [9001, 9002]  # the Slurm jobs on both hot GPUs were requeued held
    with store.session() as s:
        job1, job2 = s.get(m.OfflineJob, j1), s.get(m.OfflineJob, j2)
        assert job1.state == "EVICTED" and "Overlimit" in job1.state_reason
        assert job2.state == "PENDING"  # moved by someone else first: logged, left alone
        last = s.scalars(select(m.JobTransition).where(m.JobTransition.job_id == j1)
                         .order_by(m.JobTransition.id.desc())).first()
        assert (last.from_state, last.to_state) == ("RUNNING", "EVICTED")
        assert {e.job_id for e in s.scalars(select(m.Eviction))} == {j1, j2}
        rows = s.scalars(select(m.GpuMetricMinute).where(m.GpuMetricMinute.gpu_id == g0)
                         .order_by(m.GpuMetricMinute.minute_utc)).all()
        assert [r.minute_utc.replace(tzinfo=dt.timezone.utc).timestamp() - T0 for r in rows] == [0.0, 60.0]
        assert rows[0].online_qps == pytest.approx(10.0) and rows[0].online_latency_ms == pytest.approx(10.0)
        assert rows[0].online_gap_reason is not None and "solo latency" in rows[0].online_gap_reason
        assert rows[1].online_qps > 100.0 and rows[1].health == "Overlimit"
        foreign = s.scalars(select(m.GpuMetricMinute).where(m.GpuMetricMinute.gpu_id == g1)
                            .order_by(m.GpuMetricMinute.minute_utc)).all()
        assert [r.sm_activity_pct for r in foreign][1] == 1.0
        no_endpoint = foreign[0]  # the agent's own minute 0 (minute 1 is the other writer's row)
        assert "p99 latency: not modelled" in no_endpoint.online_gap_reason
