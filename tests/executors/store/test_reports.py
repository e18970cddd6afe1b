"""SQL reports: known rows in, exact figures out, identical on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import create_engine

from executors.store.db import Store
from executors.store.models import (
    DispatchLog,
    Eviction,
    Gpu,
    GpuMetricMinute,
    GpuType,
    JobExecution,
    Node,
    OfflineJob,
    OnlineService,
    Placement,
    SchedulingRound,
    ServiceInstance,
)
from executors.store.reports import list_reports, run_report, write_csv

REPORTS = {"evictions_per_day", "online_latency_per_day", "oversold_per_round", "placements_per_round",
           "restarts_per_day", "utilization_per_hour"}


def _at(day: int, hour: int, minute: int = 0, second: int = 0, us: int = 0) -> dt.datetime:
    return dt.datetime(2024, 3, day, hour, minute, second, us, tzinfo=dt.timezone.utc)


def _three_gpus(s, gpu_type: GpuType) -> list[Gpu]:
    """A node with three GPUs of ``gpu_type`` (the type and node added; the GPUs for the caller to add)."""
    s.add(gpu_type)
    node = Node(name="node-1")
    s.add(node)
    s.flush()
    return [Gpu(node_id=node.id, gpu_index=i, gpu_type=gpu_type.name, uuid=f"GPU-{i}") for i in range(3)]


def _seed(store: Store) -> dict[str, Any]:
    """Three GPUs, three jobs, three rounds, and metrics/executions/evictions around day edges."""
    with store.session() as s:
        gpus = _three_gpus(s, GpuType(name="A100", sm_count=108, memory_bytes=80 << 30, max_sm_clock_mhz=1410))
        jobs = [
            OfflineJob(name=f"job-{i}", job_type="resnet50", command="train", mem_bytes=1 << 30,
                       allowed_gpu_types=["A100"], checkpoint_dir=f"/ckpt/{i}", total_steps=100)
            for i in range(3)
        ]
        s.add_all(gpus + jobs)
        s.flush()
        g, j = [x.id for x in gpus], [x.id for x in jobs]

        def minute(gpu: int, at: dt.datetime, util: float, sm: float, mem: float,
                   job: int | None, source: str = "measured") -> GpuMetricMinute:
            return GpuMetricMinute(gpu_id=gpu, minute_utc=at, gpu_util_pct=util, sm_activity_pct=sm,
                                   sm_occupancy_pct=sm, mem_used_bytes=mem, mem_total_bytes=1000.0,
                                   sm_clock_mhz=1410.0, offline_job_id=job, health="Healthy",
                                   source=source)

        s.add_all([
            minute(g[0], _at(1, 10, 0), 80, 60, 500, j[0]),
            minute(g[0], _at(1, 10, 59, 59, 999_999), 60, 40, 300, j[0]),
            minute(g[1], _at(1, 10, 30), 20, 10, 250, None),
            minute(g[0], _at(1, 11, 0), 30, 20, 100, None),
            minute(g[2], _at(1, 10, 15), 90, 70, 900, j[1], "simulated"),
        ])
        rounds = [
            SchedulingRound(window_start_utc=_at(1, 10, 0), status="dispatched", gpus_considered=4,
                            jobs_pending=5, placements=3, objective=2.5, predicted_oversold=0.8),
            SchedulingRound(window_start_utc=_at(1, 10, 15), status="dispatched", gpus_considered=2,
                            jobs_pending=1, placements=1, objective=0.9, simulated=True),
            SchedulingRound(window_start_utc=_at(1, 10, 30)),
            # a fill of the first window: one waiting job started on a freed GPU (its executions are booked
            # to the window's round)
            SchedulingRound(window_start_utc=_at(1, 10, 0), seq=1, status="dispatched", gpus_considered=1,
                            jobs_pending=1, placements=1, objective=0.6, predicted_oversold=0.6),
        ]
        s.add_all(rounds)
        s.flush()
        r = [x.id for x in rounds]

        def place(rnd: int, job: int, gpu: int, action: str) -> Placement:
            return Placement(round_id=rnd, job_id=job, gpu_id=gpu, sm_pct=50, mem_quota_bytes=1 << 30,
                             predicted_norm_tput=0.7, predicted_online_slowdown=0.1, action=action)

        def dispatch(rnd: int, job: int, action: str) -> DispatchLog:
            return DispatchLog(round_id=rnd, action_key=f"{rnd}:{action}:{job}", action=action, job_id=job)

        s.add_all([
            place(r[0], j[0], g[0], "start"), place(r[0], j[1], g[1], "keep"),
            place(r[0], j[2], g[2], "migrate"), place(r[1], j[0], g[0], "start"), place(r[3], j[1], g[2], "start"),
            dispatch(r[0], j[0], "start"), dispatch(r[0], j[1], "evict"), dispatch(r[0], j[2], "evict"),
        ])

        def run(job: int, gpu: int, rnd: int | None, start: dt.datetime, wall: float, solo: float,
                source: str = "measured") -> JobExecution:
            return JobExecution(job_id=job, gpu_id=gpu, round_id=rnd, start_utc=start,
                                end_utc=start + dt.timedelta(seconds=wall), sm_pct=50, steps=10.0,
                                wall_s=wall, solo_equiv_s=solo, source=source)

        s.add_all([
            run(j[0], g[0], r[0], _at(1, 10, 1), 100, 80),
            run(j[1], g[1], r[0], _at(1, 10, 2), 300, 160),
            run(j[0], g[0], r[1], _at(1, 10, 16), 50, 50, "simulated"),
            run(j[2], g[2], None, _at(1, 12), 10, 5),
            run(j[2], g[2], None, _at(1, 23, 59, 59, 999_999), 10, 5),
            run(j[1], g[0], None, _at(2, 0), 10, 5),
            run(j[1], g[1], None, _at(2, 1), 10, 5, "simulated"),
        ])

        def evict(job: int, gpu: int, at: dt.datetime, source: str = "measured") -> Eviction:
            return Eviction(job_id=job, gpu_id=gpu, at_utc=at, reason="Overlimit", health="Overlimit",
                            source=source)

        s.add_all([
            evict(j[0], g[0], _at(1, 10, 40)),
            evict(j[0], g[1], _at(1, 23, 59, 59, 999_999)),
            evict(j[1], g[1], _at(1, 11), "simulated"),
            evict(j[1], g[0], _at(2, 0)),
            evict(j[2], g[2], _at(3, 5)),
        ])
    return {"rounds": r, "jobs": j, "gpus": g}


def _norm(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        # Rounded so that both backends' float sums compare equal to the exact figure.
        return round(float(value), 9)
    return value


def _rows(df: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(_norm(v) for v in row) for row in df.itertuples(index=False, name=None)]


def _check(df: pd.DataFrame, columns: list[str], expected: list[tuple[Any, ...]]) -> None:
    assert list(df.columns) == columns
    assert _rows(df) == [tuple(_norm(v) for v in row) for row in expected]


UTILIZATION_COLUMNS = [
    "hour_utc", "source", "gpu_minutes", "gpu_util_pct", "sm_activity_pct", "mem_used_pct",
    "shared_minutes", "shared_gpu_util_pct", "shared_sm_activity_pct", "shared_mem_used_pct",
    "online_only_minutes", "online_only_gpu_util_pct", "online_only_sm_activity_pct",
    "online_only_mem_used_pct",
]
UTILIZATION_ROWS = [
    ("2024-03-01 10:00", "measured", 3, 160 / 3, 110 / 3, 35.0, 2, 70.0, 50.0, 40.0, 1, 20.0, 10.0, 25.0),
    ("2024-03-01 10:00", "simulated", 1, 90.0, 70.0, 90.0, 1, 90.0, 70.0, 90.0, 0, None, None, None),
    ("2024-03-01 11:00", "measured", 1, 30.0, 20.0, 10.0, 0, None, None, None, 1, 30.0, 20.0, 10.0),
]


def test_utilization_per_hour(store: Store) -> None:
    _seed(store)
    _check(run_report(store, "utilization_per_hour"), UTILIZATION_COLUMNS, UTILIZATION_ROWS)


def test_oversold_per_round(store: Store) -> None:
    r = _seed(store)["rounds"]
    _check(
        run_report(store, "oversold_per_round"),
        ["round_id", "window_start_utc", "status", "placements", "objective", "predicted_oversold",
         "executions", "wall_s", "solo_equiv_s", "oversold_gpu", "source"],
        [
            (r[0], "2024-03-01 10:00:00", "dispatched", 3, 2.5, 0.8, 2, 400.0, 240.0, 0.6, "measured"),
            (r[1], "2024-03-01 10:15:00", "dispatched", 1, 0.9, None, 1, 50.0, 50.0, 1.0, "simulated"),
            (r[2], "2024-03-01 10:30:00", "planned", 0, 0.0, None, 0, None, None, None, "measured"),
        ],
    )


def test_evictions_per_day(store: Store) -> None:
    _seed(store)
    _check(
        run_report(store, "evictions_per_day"),
        ["day_utc", "source", "evictions", "jobs_evicted", "gpus_affected", "executions_started",
         "eviction_rate"],
        [
            ("2024-03-01", "measured", 2, 1, 2, 4, 0.5),
            ("2024-03-01", "simulated", 1, 1, 1, 1, 1.0),
            ("2024-03-02", "measured", 1, 1, 1, 1, 1.0),
            ("2024-03-02", "simulated", 0, 0, 0, 1, 0.0),
            ("2024-03-03", "measured", 1, 1, 1, 0, None),
        ],
    )


def test_restarts_per_day(store: Store) -> None:
    seeded = _seed(store)
    j, g = seeded["jobs"], seeded["gpus"]
    with store.session() as s:  # the next day: job 2 restarted at a new share on its GPU, then moved; job 0 moved
        later = [SchedulingRound(window_start_utc=_at(2, 9, 0)), SchedulingRound(window_start_utc=_at(2, 9, 15))]
        s.add_all(later)
        s.flush()
        for rnd, job, gpu, action in [(later[0], j[2], g[2], "migrate"), (later[0], j[0], g[1], "migrate"),
                                      (later[1], j[2], g[0], "migrate"), (later[1], j[0], g[1], "keep")]:
            s.add(Placement(round_id=rnd.id, job_id=job, gpu_id=gpu, sm_pct=40, mem_quota_bytes=1 << 30,
                            predicted_norm_tput=0.5, predicted_online_slowdown=0.1, action=action))
    _check(
        run_report(store, "restarts_per_day"),
        ["day_utc", "source", "jobs_placed", "restarts", "moves", "new_shares", "restarts_per_job",
         "most_restarts_of_a_job"],
        [
            # job 2's first placement is a migration from where the store never saw it: a move; job 1 started in
            # a fill on another GPU than its round kept it on (a start is never a restart); job 0's starts
            ("2024-03-01", "measured", 3, 1, 1, 0, 1 / 3, 1),
            ("2024-03-01", "simulated", 1, 0, 0, 0, 0.0, 0),
            # job 0 moved (from its simulated round's GPU 0 to GPU 1), job 2 restarted on GPU 2, then moved
            ("2024-03-02", "measured", 2, 3, 2, 1, 1.5, 2),
        ],
    )


def test_placements_per_round(store: Store) -> None:
    r = _seed(store)["rounds"]
    _check(
        run_report(store.engine, "placements_per_round"),
        ["round_id", "window_start_utc", "fill", "status", "gpus_considered", "jobs_pending", "placements",
         "starts", "keeps", "migrates", "evictions", "objective", "source"],
        [
            (r[0], "2024-03-01 10:00:00", 0, "dispatched", 4, 5, 3, 1, 1, 1, 2, 2.5, "measured"),
            (r[3], "2024-03-01 10:00:00", 1, "dispatched", 1, 1, 1, 1, 0, 0, 0, 0.6, "measured"),
            (r[1], "2024-03-01 10:15:00", 0, "dispatched", 2, 1, 1, 1, 0, 0, 0, 0.9, "simulated"),
            (r[2], "2024-03-01 10:30:00", 0, "planned", 0, 0, 0, 0, 0, 0, 0, 0.0, "measured"),
        ],
    )


def test_online_latency_per_day(store: Store) -> None:
    with store.session() as s:
        gpus = _three_gpus(s, GpuType(name="T4", sm_count=40, memory_bytes=16 << 30, max_sm_clock_mhz=1590))
        svcs = [OnlineService(name="rec", model_family="recommender", qps_min=1, qps_max=10, latency_slo_ms=100,
                              mem_bytes=1 << 30, slowdown_allowance=0.3, slowdown_budget=0.1),
                OnlineService(name="vision", model_family="cnn", qps_min=1, qps_max=10, latency_slo_ms=100,
                              mem_bytes=1 << 30, slowdown_allowance=0.2)]
        job = OfflineJob(name="j", job_type="resnet50", command="train", mem_bytes=1 << 30,
                         allowed_gpu_types=["T4"], checkpoint_dir="/ckpt", total_steps=100)
        s.add_all(gpus + svcs + [job])
        s.flush()
        s.add_all([ServiceInstance(service_id=svcs[0].id, gpu_id=gpus[0].id),
                   ServiceInstance(service_id=svcs[0].id, gpu_id=gpus[1].id),
                   ServiceInstance(service_id=svcs[1].id, gpu_id=gpus[2].id)])

        def minute(gpu: Gpu, at: dt.datetime, qps: float | None, lat: float | None, solo: float | None,
                   shared: bool) -> GpuMetricMinute:
            return GpuMetricMinute(gpu_id=gpu.id, minute_utc=at, gpu_util_pct=50, sm_activity_pct=40,
                                   sm_occupancy_pct=40, mem_used_bytes=1.0, mem_total_bytes=10.0, sm_clock_mhz=1590.0,
                                   offline_job_id=job.id if shared else None, health="Healthy", source="measured",
                                   online_qps=qps, online_latency_ms=lat, online_solo_latency_ms=solo)

        s.add_all([
            # rec, day 1: a busy unshared minute (10 req/s at 20 ms) and a quiet shared one (2 req/s, 10 -> 13 ms)
            # on two replicas; a gap (no solo latency) is left out.
            minute(gpus[0], _at(1, 20), 10.0, 20.0, 20.0, False),
            minute(gpus[1], _at(1, 3), 2.0, 13.0, 10.0, True),
            minute(gpus[1], _at(1, 4), 5.0, 50.0, None, True),
            # vision, day 2: one shared minute, +10 %.
            minute(gpus[2], _at(2, 12), 4.0, 11.0, 10.0, True),
        ])
    _check(
        run_report(store, "online_latency_per_day"),
        ["day_utc", "service", "source", "gpu_minutes", "requests", "mean_latency_ms", "mean_solo_latency_ms",
         "slowdown_all_requests", "shared_minutes", "slowdown_shared_requests", "slowdown_allowance",
         "slowdown_budget"],
        [
            # all requests: (10*20 + 2*13) / (10*20 + 2*10) - 1 = 226/220 - 1; shared: 26/20 - 1
            ("2024-03-01", "rec", "measured", 2, 720.0, 226 / 12, 220 / 12, 226 / 220 - 1, 1, 0.3, 0.3, 0.1),
            ("2024-03-02", "vision", "measured", 1, 240.0, 11.0, 10.0, 0.1, 1, 0.1, 0.2, None),
        ],
    )


def test_every_report_runs_on_an_empty_store(store: Store) -> None:
    for info in list_reports():
        df = run_report(store, info.name)
        assert df.empty and len(df.columns) > 0, info.name


@pytest.mark.postgres
def test_buckets_stay_utc_whatever_the_session_timezone(postgres_store_url: str) -> None:
    # A +05:30 session would shift hours and render dates as DD/MM/YYYY
    # if the runner did not pin TimeZone and DateStyle.
    store = Store(postgres_store_url)
    engine = create_engine(
        postgres_store_url,
        connect_args={"options": "-c TimeZone=Asia/Kolkata -c DateStyle=SQL,DMY"},
    )
    try:
        _seed(store)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "Asia/Kolkata"
        _check(run_report(engine, "utilization_per_hour"), UTILIZATION_COLUMNS, UTILIZATION_ROWS)
        with engine.connect() as conn:  # SET LOCAL did not leak into the pooled connection
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "Asia/Kolkata"
    finally:
        engine.dispose()
        store.dispose()


def test_list_reports_reads_title_and_description() -> None:
    reports = list_reports()
    assert [r.name for r in reports] == sorted(REPORTS)
    for r in reports:
        assert r.title and r.description and r.path.is_file()
        assert r.path.read_text(encoding="utf-8").startswith("-- title: ")


def test_report_without_header_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "bare.sql").write_text("SELECT 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="title"):
        list_reports(tmp_path)


def test_unknown_report_lists_the_available_ones(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    try:
        with pytest.raises(KeyError) as info:
            run_report(store, "no_such_report")
    finally:
        store.dispose()
    message = str(info.value)
    assert "no_such_report" in message
    assert all(name in message for name in REPORTS)


def test_write_csv_round_trips(tmp_path: Path) -> None:
    df = pd.DataFrame({"hour_utc": ["2024-03-01 10:00"], "gpu_minutes": [3], "gpu_util_pct": [None]})
    path = write_csv(df, tmp_path / "out" / "util.csv")
    assert path == tmp_path / "out" / "util.csv"
    back = pd.read_csv(path)
    assert list(back.columns) == list(df.columns)
    assert back.iloc[0, 0] == "2024-03-01 10:00" and back.iloc[0, 1] == 3
    assert math.isnan(back.iloc[0, 2])
