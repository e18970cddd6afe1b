"""The scheduler's Prometheus endpoint: what the feature store holds of rounds, jobs, dispatch and throughput, read
at scrape time (SQLite and PostgreSQL), and ``muxflow metrics show``/``serve``."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import urllib.request

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import select

from executors.scheduler.metrics import SchedulerCollector
from executors.store import models as m
from executors.store.jobs import transition
from scheduler_core.domain import JobState
from tests.prometheus_helpers import one as value
from tests.prometheus_helpers import parse_series as series

NOW = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)
REPO = __import__("pathlib").Path(__file__).resolve().parents[3]


def scrape(store) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SchedulerCollector(store, now=lambda: NOW))
    return series(generate_latest(reg).decode())


def _history(store) -> dict[str, int]:
    """A finished round (2 starts on a10, 1 keep on t4), executions in the last hour, dispatch, an eviction; two of
    the submitted jobs PENDING, one since 30 min, one since 10."""
    with store.session() as s:
        gpus = {t: s.scalars(select(m.Gpu).where(m.Gpu.gpu_type == t).order_by(m.Gpu.id)).all() for t in ("a10", "t4")}
        jobs = s.scalars(select(m.OfflineJob).order_by(m.OfflineJob.id)).all()
        rnd = m.SchedulingRound(window_start_utc=NOW - dt.timedelta(minutes=15), status="dispatched", period_s=900,
                                started_utc=NOW - dt.timedelta(seconds=70), finished_utc=NOW - dt.timedelta(seconds=60),
                                objective=2.25, certified_optimal=True, optimality_gap_bound=0.0,
                                predicted_oversold=0.41, action_counts={"start": 2, "keep": 1}, simulated=True,
                                stats={"unplaced": {"counts": {"no GPU free": 3}}})
        s.add(rnd)
        s.flush()
        for j, g, action, tput in ((jobs[0], gpus["a10"][0], "start", 0.8), (jobs[1], gpus["a10"][1], "start", 0.6),
                                   (jobs[2], gpus["t4"][0], "keep", 0.5)):
            s.add(m.Placement(round_id=rnd.id, job_id=j.id, gpu_id=g.id, sm_pct=50, mem_quota_bytes=1 << 30,
                              predicted_norm_tput=tput, predicted_online_slowdown=0.1, action=action))
            s.add(m.DispatchLog(round_id=rnd.id, action_key=f"{rnd.id}-{j.id}", action=action, job_id=j.id,
                                gpu_id=g.id, status="done"))
        s.add(m.DispatchLog(round_id=rnd.id, action_key=f"{rnd.id}-x", action="migrate", job_id=jobs[3].id,
                            status="failed", error="Slurm did not answer"))
        for g, solo, wall, end in ((gpus["a10"][0], 420.0, 600.0, NOW - dt.timedelta(minutes=5)),
                                   (gpus["a10"][1], 300.0, 600.0, NOW - dt.timedelta(minutes=2)),
                                   (gpus["t4"][0], 999.0, 1000.0, NOW - dt.timedelta(hours=3))):  # too old
            s.add(m.JobExecution(job_id=jobs[0].id, gpu_id=g.id, round_id=rnd.id, start_utc=end - dt.timedelta(
                seconds=wall), end_utc=end, sm_pct=50, steps=1.0, wall_s=wall, solo_equiv_s=solo, source="simulated"))
        s.add(m.Eviction(job_id=jobs[0].id, gpu_id=gpus["t4"][1].id, at_utc=NOW, reason="Overlimit", health="Overlimit",
                         source="simulated"))
        # job 2 migrated in a later round; its replica's minutes today: 10 rps at 12 ms (solo 10), 30 rps at 11 ms
        later = m.SchedulingRound(window_start_utc=NOW - dt.timedelta(minutes=30), status="dispatched", period_s=900,
                                  started_utc=NOW - dt.timedelta(minutes=30),
                                  finished_utc=NOW - dt.timedelta(minutes=29))
        s.add(later)
        s.flush()
        s.add(m.Placement(round_id=later.id, job_id=jobs[2].id, gpu_id=gpus["t4"][2].id, sm_pct=50,
                          mem_quota_bytes=1 << 30, predicted_norm_tput=0.5, predicted_online_slowdown=0.1,
                          action="migrate"))
        jobs[2].slurm_job_id, jobs[2].run_as_user = 812, "alice"
        inst = s.scalars(select(m.ServiceInstance).order_by(m.ServiceInstance.id)).first()
        svc = s.get(m.OnlineService, inst.service_id)
        svc.slowdown_budget = 0.25
        for minute, qps, lat in ((1, 10.0, 12.0), (2, 30.0, 11.0)):
            s.add(m.GpuMetricMinute(gpu_id=inst.gpu_id, minute_utc=NOW - dt.timedelta(minutes=minute),
                                    gpu_util_pct=1.0, sm_activity_pct=1.0, sm_occupancy_pct=0.0, mem_used_bytes=1.0,
                                    mem_total_bytes=2.0, sm_clock_mhz=1.0, health="Healthy", source="simulated",
                                    online_qps=qps, online_latency_ms=lat, online_solo_latency_ms=10.0))
        for j, minutes in ((jobs[4], 30), (jobs[5], 10)):
            transition(s, j.id, JobState.PROFILING, "test")
            transition(s, j.id, JobState.PENDING, "profiled")
            last = s.scalars(select(m.JobTransition).where(m.JobTransition.job_id == j.id)
                             .order_by(m.JobTransition.id.desc())).first()
            last.at_utc = NOW - dt.timedelta(minutes=minutes)
        return {"round": rnd.id, "service": svc.name}


def test_the_latest_round_jobs_dispatch_and_throughput(cluster_store) -> None:
    h = _history(cluster_store)
    got = scrape(cluster_store)
    assert value(got, "muxflow_scheduler_store_up") == 1.0
    assert value(got, "muxflow_round_last_duration_seconds", simulated="true") == pytest.approx(10.0)
    assert value(got, "muxflow_round_last_finished_timestamp_seconds") == (NOW - dt.timedelta(seconds=60)).timestamp()
    assert value(got, "muxflow_round_last_objective") == 2.25
    assert value(got, "muxflow_round_last_optimality_gap") == 0.0
    assert value(got, "muxflow_round_last_certified_optimal") == 1.0
    assert value(got, "muxflow_round_last_predicted_oversold") == pytest.approx(0.41)
    assert {lab["action"]: v for lab, v in got["muxflow_round_last_placements"]} == {
        "start": 2.0, "keep": 1.0, "migrate": 0.0, "evict": 0.0}
    assert value(got, "muxflow_round_last_unplaced_jobs", reason="no GPU free") == 3.0
    assert value(got, "muxflow_rounds_total", status="dispatched") == 2.0
    assert value(got, "muxflow_jobs", state="PENDING") == 2.0 and value(got, "muxflow_jobs", state="SUBMITTED") == 4.0
    assert value(got, "muxflow_jobs_oldest_pending_seconds") == pytest.approx(1800.0)
    assert value(got, "muxflow_dispatch_actions_total", action="start", status="done") == 2.0
    assert value(got, "muxflow_dispatch_actions_total", action="migrate", status="failed") == 1.0
    assert value(got, "muxflow_predicted_normalized_throughput", gpu_type="a10") == pytest.approx(0.7)
    assert value(got, "muxflow_predicted_normalized_throughput", gpu_type="t4") == pytest.approx(0.5)
    assert value(got, "muxflow_realized_normalized_throughput", gpu_type="a10") == pytest.approx(720 / 1200)
    assert "t4" not in {lab["gpu_type"] for lab, _ in got["muxflow_realized_normalized_throughput"]}  # 3 h old
    assert value(got, "muxflow_evictions_total", gpu_type="t4") == 1.0
    svc = h["service"]
    assert value(got, "muxflow_service_day_requests", service=svc) == pytest.approx(60 * 40.0)
    assert value(got, "muxflow_service_day_slowdown_ratio", service=svc) == pytest.approx(450 / 400 - 1)
    assert value(got, "muxflow_service_slowdown_budget_ratio", service=svc) == 0.25
    assert value(got, "muxflow_service_day_budget_used_ratio", service=svc) == pytest.approx(0.125 / 0.25)
    others = {lab["service"] for lab, _ in got["muxflow_service_day_requests"]} - {svc}
    assert others and all(value(got, "muxflow_service_day_requests", service=o) == 0.0 for o in others)
    assert value(got, "muxflow_job_migrations_total", hpc_job="812", user="alice") == 1.0


def test_an_empty_store_and_a_store_that_does_not_answer(cluster_store) -> None:
    got = scrape(cluster_store)
    assert value(got, "muxflow_scheduler_store_up") == 1.0 and "muxflow_round_last_objective" not in got
    assert "muxflow_jobs_oldest_pending_seconds" not in got

    class Down:
        def session(self):
            raise OSError("connection refused")

    got = scrape(Down())
    assert list(got) == ["muxflow_scheduler_store_up"] and value(got, "muxflow_scheduler_store_up") == 0.0


def test_metrics_show_and_serve_from_the_command_line(cluster_store, store_url) -> None:
    from pipelines.cli.main import main

    _history(cluster_store)
    res = CliRunner().invoke(main, ["--db", store_url, "metrics", "show"])
    assert res.exit_code == 0, res.output
    assert value(series(res.output), "muxflow_round_last_objective") == 2.25
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "--db", store_url, "metrics", "serve", "--port",
                             "0", "--host", "127.0.0.1"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "/metrics" in line, line
        url = line.split()[1]
        with urllib.request.urlopen(url, timeout=10) as r:
            got = series(r.read().decode())
        assert value(got, "muxflow_dispatch_actions_total", action="migrate", status="failed") == 1.0
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_the_exposition_passes_promtool(cluster_store) -> None:
    from tests.prometheus_helpers import promtool

    _history(cluster_store)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SchedulerCollector(cluster_store, now=lambda: NOW))
    out = promtool("check", "metrics", stdin=generate_latest(reg).decode())
    assert out.returncode == 0, out.stdout + out.stderr
