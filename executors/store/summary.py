"""What a scheduling run's summary reads from the store (the main job's figures and plots)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from executors.store import models as m

_MT = m.GpuMetricMinute


def sample_counts_by_type(s: Session) -> dict[str, int]:
    return dict(s.execute(select(m.ColocationSample.gpu_type, func.count()).group_by(m.ColocationSample.gpu_type)).all())


def predictor_versions(s: Session) -> list[m.PredictorModel]:
    """Every trained predictor version, by GPU type and version."""
    return list(s.scalars(select(m.PredictorModel).order_by(m.PredictorModel.gpu_type, m.PredictorModel.version)))


@dataclass(frozen=True)
class RunFigures:
    """Per GPU-minute since a time: whole-GPU and online-only metrics, and whether the minute was shared."""

    metrics: np.ndarray  # columns: util, SM, mem frac, online util, online SM, online mem frac, latency slowdown
    shared: np.ndarray   # bool per row: an offline job ran on the GPU that minute
    solo_equiv_s: float
    wall_s: float
    executions: int
    evictions: int
    jobs_by_state: dict[str, int]


def run_figures(s: Session, since_utc: dt.datetime) -> RunFigures:
    rows = s.execute(select(
        _MT.gpu_util_pct, _MT.sm_activity_pct, _MT.mem_used_bytes / _MT.mem_total_bytes,
        _MT.online_gpu_util_pct, _MT.online_sm_activity_pct, _MT.online_mem_used_bytes / _MT.mem_total_bytes,
        _MT.online_latency_ms / _MT.online_solo_latency_ms, _MT.offline_job_id,
    ).where(_MT.minute_utc >= since_utc)).all()
    arr = np.array([[np.nan if v is None else float(v) for v in r[:7]] for r in rows]).reshape(-1, 7)
    shared = np.array([r[7] is not None for r in rows], dtype=bool)
    solo, wall, n = s.execute(select(func.sum(m.JobExecution.solo_equiv_s), func.sum(m.JobExecution.wall_s),
                                     func.count())).one()
    evictions = s.scalar(select(func.count()).select_from(m.Eviction)) or 0
    states = dict(s.execute(select(m.OfflineJob.state, func.count()).group_by(m.OfflineJob.state)).all())
    return RunFigures(arr, shared, float(solo or 0.0), float(wall or 0.0), int(n or 0), int(evictions), states)


def utilization_per_minute(s: Session) -> pd.DataFrame:
    """Cluster average per minute: shared and online-only GPU utilization, SM activity and memory (%)."""
    df = pd.DataFrame(s.execute(select(
        _MT.minute_utc, _MT.gpu_util_pct, _MT.sm_activity_pct, _MT.online_gpu_util_pct, _MT.online_sm_activity_pct,
        (100 * _MT.mem_used_bytes / _MT.mem_total_bytes).label("mem_pct"),
        (100 * _MT.online_mem_used_bytes / _MT.mem_total_bytes).label("online_mem_pct"),
    )).all())
    return df.groupby("minute_utc").mean(numeric_only=True) if len(df) else df


def _shared_minutes(since_utc: dt.datetime, *columns):
    """``columns`` of each replica-minute since ``since_utc`` on which an offline job shared the replica's GPU (the
    metrics joined to the replica's service)."""
    return (select(*columns)
            .join(m.ServiceInstance, m.ServiceInstance.gpu_id == _MT.gpu_id)
            .join(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
            .where(_MT.minute_utc >= since_utc, _MT.offline_job_id.is_not(None)))


def shared_service_minutes(s: Session, since_utc: dt.datetime) -> pd.DataFrame:
    """Each replica-minute since a time on which an offline job ran beside the replica: its service (name,
    allowance, budget), the measured slowdown (latency over latency alone), the requests, and the online slowdown
    the round that placed the job there predicted (None: no round's placement of that job on that GPU covers
    the minute)."""
    rows = s.execute(_shared_minutes(
        since_utc, m.OnlineService.name, m.OnlineService.slowdown_allowance, m.OnlineService.slowdown_budget,
        _MT.gpu_id, _MT.minute_utc, _MT.offline_job_id, _MT.online_qps,
        _MT.online_latency_ms / _MT.online_solo_latency_ms)).all()
    cols = ["service", "allowance", "budget", "gpu_id", "minute_utc", "job_id", "qps", "slowdown"]
    df = pd.DataFrame(rows, columns=cols)
    planned = s.execute(select(
        m.Placement.gpu_id, m.Placement.job_id, m.Placement.predicted_online_slowdown,
        m.SchedulingRound.window_start_utc, m.SchedulingRound.period_s, m.SchedulingRound.seq,
    ).join(m.SchedulingRound, m.SchedulingRound.id == m.Placement.round_id)).all()
    # The prediction in force at a minute: the latest round (or fill) of the minute's window that placed the job there.
    by_pair: dict[tuple[int, int], list[tuple[dt.datetime, dt.datetime, int, float]]] = {}
    for gpu, job, pred, start, period, seq in planned:
        start = start if start.tzinfo else start.replace(tzinfo=dt.timezone.utc)
        by_pair.setdefault((gpu, job), []).append((start, start + dt.timedelta(seconds=period), seq, pred))
    preds = []
    for gpu, job, minute in zip(df["gpu_id"], df["job_id"], df["minute_utc"]):
        t = minute if minute.tzinfo else minute.replace(tzinfo=dt.timezone.utc)
        hits = [(seq, p) for a, b, seq, p in by_pair.get((gpu, job), ()) if a <= t < b]
        preds.append(max(hits)[1] if hits else None)
    df["predicted"] = preds
    return df


def service_minutes(s: Session, since_utc: dt.datetime,
                    until_utc: dt.datetime) -> dict[str, tuple[np.ndarray, np.ndarray, list[dt.datetime], np.ndarray]]:
    """Per service, each minute in [``since_utc``, ``until_utc``) its replicas have requests in: the slowdown of its
    requests (latency over latency alone, request-weighted over its replicas; a replica without an offline job beside
    it, or without a latency, counts 1, and one faster than alone counts 1), their weight (requests × latency alone,
    summed over the replicas), the minute (UTC) and how many replica-minutes it holds — what a budget's pacing reads
    (:mod:`scheduler_core.online.budget_pacing`). Summed in the database: one row per service-minute, not per
    replica-minute."""
    lat, solo, qps = _MT.online_latency_ms, _MT.online_solo_latency_ms, _MT.online_qps
    spend = case((and_(_MT.offline_job_id.is_not(None), lat > solo), (lat - solo) * qps), else_=0.0)
    rows = s.execute(
        select(m.OnlineService.name, _MT.minute_utc, func.sum(spend), func.sum(qps * solo), func.count())
        .join(m.ServiceInstance, m.ServiceInstance.gpu_id == _MT.gpu_id)
        .join(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
        .where(_MT.minute_utc >= since_utc, _MT.minute_utc < until_utc, qps > 0, solo > 0)
        .group_by(m.OnlineService.name, _MT.minute_utc)
        .order_by(m.OnlineService.name, _MT.minute_utc)).all()
    by: dict[str, tuple[list[float], list[float], list[dt.datetime], list[int]]] = {}
    for name, minute, spent_w, weight, n in rows:
        slow, wts, stamps, counts = by.setdefault(name, ([], [], [], []))
        slow.append(1.0 + float(spent_w or 0.0) / float(weight))
        wts.append(float(weight))
        stamps.append(minute if minute.tzinfo else minute.replace(tzinfo=dt.timezone.utc))
        counts.append(int(n))
    return {name: (np.asarray(a, dtype=float), np.asarray(b, dtype=float), c, np.asarray(d, dtype=np.int64))
            for name, (a, b, c, d) in by.items()}


@dataclass(frozen=True)
class SharedMinute:
    """One replica-minute with an offline job beside the replica, as the allowance correction reads it."""

    service: str
    minute_utc: dt.datetime
    measured: float | None  # latency over latency alone (1.25 = +25 %); None: a gap in the latency
    allowance: float  # the service's declared slowdown allowance (0.2 = +20 %)
    qps: float | None


def recent_shared_minutes(s: Session, since_utc: dt.datetime) -> list[SharedMinute]:
    """Each replica-minute since ``since_utc`` on which an offline job shared the replica's GPU, with the slowdown
    measured and the service's declared allowance (:mod:`scheduler_core.online.correction` turns a service's
    minutes into its tail against the allowance). Leaner than :func:`shared_service_minutes`, for every round."""
    rows = s.execute(_shared_minutes(
        since_utc, m.OnlineService.name, _MT.minute_utc, _MT.online_qps, m.OnlineService.slowdown_allowance,
        _MT.online_latency_ms / _MT.online_solo_latency_ms)).all()
    out = []
    for name, minute, qps, allowance, ratio in rows:
        t = minute if minute.tzinfo else minute.replace(tzinfo=dt.timezone.utc)
        out.append(SharedMinute(name, t, None if ratio is None else float(ratio), float(allowance),
                                None if qps is None else float(qps)))
    return out
