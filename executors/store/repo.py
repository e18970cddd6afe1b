"""Feature-store reads and writes used by the CLI, the main job and (later) Dagster assets.

Each function takes an open session; the caller's ``Store.session()`` is the
transaction, so a command either writes everything or nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import asdict

import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from executors.cluster import EvictionRecord, ExecutionRecord, MetricRow
from executors.store import models as m
from scheduler_core.domain import (
    GpuHealth,
    GpuTypeSpec,
    JobState,
    OfflineFeatures,
    PlannedPlacement,
    RoundResult,
)
from scheduler_core.prediction.predictor import PredictorConfig, SpeedPredictor, TrainingReport
from scheduler_core.round.clock import DEFAULT_PERIOD_S


def upsert_gpu_type(s: Session, spec: GpuTypeSpec) -> m.GpuType:
    row = s.get(m.GpuType, spec.name)
    if row is None:
        row = m.GpuType(name=spec.name)
        s.add(row)
    row.sm_count, row.memory_bytes, row.max_sm_clock_mhz = spec.sm_count, spec.memory_bytes, spec.max_sm_clock_mhz
    return row


def gpu_type_names(s: Session) -> set[str]:
    return set(s.scalars(select(m.GpuType.name)))


def cluster_is_empty(s: Session) -> bool:
    return s.scalar(select(func.count()).select_from(m.Node)) == 0


def job_counts_by_state(s: Session) -> dict[str, int]:
    return dict(s.execute(select(m.OfflineJob.state, func.count()).group_by(m.OfflineJob.state)).all())


def jobs_in_states(s: Session, states: Iterable[JobState]) -> list[m.OfflineJob]:
    return list(
        s.scalars(
            select(m.OfflineJob).where(m.OfflineJob.state.in_([st.value for st in states])).order_by(m.OfflineJob.id)
        )
    )


def save_profile(s: Session, job_id: int, gpu_type: str, f: OfflineFeatures, source: str, method: str = "model",
                 **measured: object) -> None:
    """Store a job's solo profile on a GPU type (replacing an older one); ``measured``: the profiling
    run's figures (``iterations``, ``measured_iter_time_s``, ``device``, ... columns of ``job_profiles``)."""
    if method not in m.PROFILE_METHODS:
        raise ValueError(f"profile method {method!r} (known: {', '.join(m.PROFILE_METHODS)})")
    s.execute(delete(m.JobProfile).where(m.JobProfile.job_id == job_id, m.JobProfile.gpu_type == gpu_type))
    s.add(m.JobProfile(job_id=job_id, gpu_type=gpu_type, source=source, method=method, **asdict(f), **measured))


def profiles_by_job(s: Session, job_ids: list[int]) -> dict[int, dict[str, OfflineFeatures]]:
    out: dict[int, dict[str, OfflineFeatures]] = {}
    if not job_ids:
        return out
    fields = OfflineFeatures.__dataclass_fields__
    for p in s.scalars(select(m.JobProfile).where(m.JobProfile.job_id.in_(job_ids))):
        out.setdefault(p.job_id, {})[p.gpu_type] = OfflineFeatures(**{k: getattr(p, k) for k in fields})
    return out


def add_samples(s: Session, samples: Iterable[object]) -> int:
    rows = [m.ColocationSample(**asdict(x)) for x in samples]
    s.add_all(rows)
    return len(rows)


def _training_samples(gpu_type: str):
    # Samples the harness took on a CPU test its plumbing; they are never a GPU type's training data.
    return (m.ColocationSample.gpu_type == gpu_type,
            m.ColocationSample.method.not_in(m.NOT_TRAINING_METHODS))


def samples_for(s: Session, gpu_type: str) -> list[m.ColocationSample]:
    """A GPU type's training samples (simulated and GPU-measured), oldest first."""
    return list(s.scalars(
        select(m.ColocationSample).where(*_training_samples(gpu_type)).order_by(m.ColocationSample.id)
    ))


def sample_count(s: Session, gpu_type: str) -> int:
    return s.scalar(select(func.count()).select_from(m.ColocationSample).where(*_training_samples(gpu_type)))


def sample_counts_by_method(s: Session) -> dict[tuple[str, str], int]:
    """(GPU type, method) → number of co-location samples, every method included."""
    q = select(m.ColocationSample.gpu_type, m.ColocationSample.method, func.count()).group_by(
        m.ColocationSample.gpu_type, m.ColocationSample.method)
    return {(g, meth): n for g, meth, n in s.execute(q)}


def model_row(s: Session, gpu_type: str, version: int) -> m.PredictorModel:
    row = s.scalars(
        select(m.PredictorModel).where(m.PredictorModel.gpu_type == gpu_type, m.PredictorModel.version == version)
    ).first()
    if row is None:
        raise KeyError(f"no predictor {gpu_type} v{version} in the store")
    return row


def latest_model_version(s: Session, gpu_type: str) -> int | None:
    return s.scalar(select(func.max(m.PredictorModel.version)).where(m.PredictorModel.gpu_type == gpu_type))


def set_promoted(s: Session, gpu_type: str, version: int) -> None:
    """Make ``version`` the one promoted model of its GPU type."""
    target = model_row(s, gpu_type, version)
    for old in s.scalars(select(m.PredictorModel).where(m.PredictorModel.gpu_type == gpu_type)):
        old.promoted = old.id == target.id


def current_model(s: Session, gpu_type: str) -> m.PredictorModel | None:
    return s.scalars(
        select(m.PredictorModel)
        .where(m.PredictorModel.gpu_type == gpu_type, m.PredictorModel.promoted.is_(True))
        .order_by(m.PredictorModel.version.desc())
        .limit(1)
    ).first()


def save_model(
    s: Session, gpu_type: str, model: SpeedPredictor, cfg: PredictorConfig, report: TrainingReport,
    promoted: bool, trained_on: str,
) -> m.PredictorModel:
    version = (s.scalar(select(func.max(m.PredictorModel.version)).where(m.PredictorModel.gpu_type == gpu_type)) or 0) + 1
    if promoted:
        for old in s.scalars(select(m.PredictorModel).where(m.PredictorModel.gpu_type == gpu_type)):
            old.promoted = False
    row = m.PredictorModel(
        gpu_type=gpu_type, version=version, blob=model.to_bytes(), config=asdict(cfg),
        feature_ranges=report.feature_ranges, n_train=report.n_train, n_holdout=report.n_holdout,
        holdout_mae_tput=report.holdout_mae_tput, holdout_mae_slowdown=report.holdout_mae_slowdown,
        holdout_mape_tput=_finite_or_none(report.holdout_mape_tput),
        holdout_mape_slowdown=_finite_or_none(report.holdout_mape_slowdown),
        promoted=promoted, trained_on=trained_on,
    )
    s.add(row)
    s.flush()
    return row


def load_predictor_versions(s: Session) -> dict[str, tuple[int, SpeedPredictor]]:
    """The promoted model of each GPU type with its version."""
    out = {}
    for gtype in sorted(gpu_type_names(s)):
        row = current_model(s, gtype)
        if row is not None:
            out[gtype] = (row.version, SpeedPredictor.from_bytes(row.blob))
    return out


def has_promoted_predictor(s: Session) -> bool:
    """Whether any GPU type has a promoted speed predictor (what a round needs before it changes anything)."""
    return s.scalar(select(m.PredictorModel.id).where(m.PredictorModel.promoted.is_(True)).limit(1)) is not None


def load_predictor(s: Session, gpu_type: str, version: int) -> SpeedPredictor:
    return SpeedPredictor.from_bytes(model_row(s, gpu_type, version).blob)


def write_metrics(s: Session, rows: list[MetricRow], source: str) -> None:
    if rows:
        s.execute(m.GpuMetricMinute.__table__.insert(), [{**asdict(r), "source": source} for r in rows])


def write_agent_metrics(s: Session, rows: list[MetricRow], source: str, own: dict) -> int:
    """A node agent's minute rows; how many were not written.

    ``own`` holds the (GPU, minute) keys this agent wrote before: such a row (the minute in
    progress, written again as it fills) is replaced. A row that someone else wrote (the
    simulated cluster, this agent before a restart) is kept and not counted as written.
    """
    from sqlalchemy import tuple_

    if not rows:
        return 0
    t = m.GpuMetricMinute
    keys = [(r.gpu_id, r.minute_utc) for r in rows]
    mine = [k for k in keys if k in own]
    if mine:
        s.execute(delete(t).where(tuple_(t.gpu_id, t.minute_utc).in_(mine)))
    others = [k for k in keys if k not in own]
    have = set()
    if others:
        for gid, minute in s.execute(select(t.gpu_id, t.minute_utc).where(tuple_(t.gpu_id, t.minute_utc).in_(others))):
            have.add((gid, minute))
    fresh = [r for r, k in zip(rows, keys) if k not in have]
    write_metrics(s, fresh, source)
    for r in fresh:
        own[(r.gpu_id, r.minute_utc)] = None
    return len(rows) - len(fresh)


def recent_online_series(s: Session, gpu_ids: list[int], since_utc: dt.datetime) -> dict[int, dict[str, np.ndarray]]:
    """Per GPU, the online service's own per-minute metrics since ``since_utc`` (oldest first)."""
    cols = (
        m.GpuMetricMinute.gpu_id, m.GpuMetricMinute.online_gpu_util_pct, m.GpuMetricMinute.online_sm_activity_pct,
        m.GpuMetricMinute.online_mem_used_bytes, m.GpuMetricMinute.online_mem_bw_util_pct,
        m.GpuMetricMinute.online_solo_latency_ms, m.GpuMetricMinute.online_qps, m.GpuMetricMinute.sm_clock_mhz,
    )
    names = ("gpu_util", "sm", "mem", "bw", "latency", "qps", "clock")
    acc: dict[int, list[tuple]] = {g: [] for g in gpu_ids}
    q = (
        select(*cols)
        .where(m.GpuMetricMinute.minute_utc >= since_utc, m.GpuMetricMinute.gpu_id.in_(gpu_ids))
        .order_by(m.GpuMetricMinute.gpu_id, m.GpuMetricMinute.minute_utc)
    )
    for row in s.execute(q):
        acc[row[0]].append(tuple(np.nan if v is None else float(v) for v in row[1:]))
    out = {}
    for gid, vals in acc.items():
        arr = np.array(vals, dtype=float).reshape(-1, len(names))
        out[gid] = {n: arr[:, i] for i, n in enumerate(names)}
    return out


def record_round(
    s: Session, window_start: dt.datetime, result: RoundResult, snapshot: dict, simulated: bool,
    jobs_pending: int, action_of: dict[int, str], period_s: int = DEFAULT_PERIOD_S, seq: int = 0,
    started_utc: dt.datetime | None = None,
) -> m.SchedulingRound:
    """Store a round (``seq`` 0) or a fill of its window (``seq`` 1, 2, …) with its placements."""
    rnd = s.scalars(select(m.SchedulingRound).where(m.SchedulingRound.window_start_utc == window_start,
                                                    m.SchedulingRound.seq == seq)).first()
    if rnd is not None:
        what = "round" if seq == 0 else f"fill {seq}"
        raise ValueError(f"{what} for window {window_start.isoformat()} already exists (id {rnd.id})")
    n_pred = sum(p.predicted_norm_tput for p in result.placements)
    rnd = m.SchedulingRound(
        window_start_utc=window_start, seq=seq, period_s=period_s, status="planned",
        **({"started_utc": started_utc} if started_utc is not None else {}),
        gpus_considered=result.gpus_considered,
        jobs_pending=jobs_pending, feasible_pairs=result.feasible_pairs, placements=len(result.placements),
        objective=result.objective,
        predicted_oversold=(n_pred / len(result.placements)) if result.placements else None,
        action_counts=result.action_counts(), timings_s=result.timings_s, snapshot=snapshot, simulated=simulated,
        certified_optimal=bool(result.certified_optimal), optimality_gap_bound=result.optimality_gap_bound,
        stats=_json_safe(result.stats),
        plan_actions=[
            {"action": a.action.value, "job_id": a.job_id, "gpu_id": a.gpu_id, "from_gpu_id": a.from_gpu_id,
             "sm_pct": a.sm_pct}
            for a in result.actions
        ],
    )
    s.add(rnd)
    s.flush()
    for p in result.placements:
        s.add(_placement_row(rnd.id, p, action_of[p.job_id]))
    return rnd


def _placement_row(round_id: int, p: PlannedPlacement, action: str) -> m.Placement:
    return m.Placement(
        round_id=round_id, job_id=p.job_id, gpu_id=p.gpu_id, sm_pct=p.sm_pct, mem_quota_bytes=p.mem_quota_bytes,
        predicted_norm_tput=p.predicted_norm_tput, predicted_online_slowdown=p.predicted_online_slowdown,
        action=action, slot=p.slot,
    )


def write_executions(s: Session, recs: list[ExecutionRecord], round_id: int | None, source: str) -> None:
    for r in recs:
        s.add(m.JobExecution(round_id=round_id, source=source, **asdict(r)))


def write_evictions(s: Session, recs: list[EvictionRecord], source: str) -> None:
    for r in recs:
        d = asdict(r)
        d.pop("steps_lost")
        s.add(m.Eviction(source=source, **d))


def set_gpu_health(s: Session, health: dict[int, str], now: dt.datetime) -> None:
    """The node agents' (or the simulated cluster's) GPU states: theirs from now on, whoever set the last."""
    for gpu in s.scalars(select(m.Gpu).where(m.Gpu.id.in_(list(health)))):
        new = GpuHealth(health[gpu.id]).value
        if gpu.health != new:
            gpu.health, gpu.health_since_utc = new, now
        gpu.health_source = m.HEALTH_BY_AGENT


def swap_gpu_health(s: Session, gpu_id: int, expected: tuple[str, str], new: tuple[str, str],
                    now: dt.datetime) -> bool:
    """Compare-and-set of a GPU's (health, source): written only if it is still ``expected`` (a node agent
    that wrote meanwhile wins). Whether it was written."""
    done = s.execute(update(m.Gpu).where(m.Gpu.id == gpu_id, m.Gpu.health == expected[0],
                                         m.Gpu.health_source == expected[1])
                     .values(health=new[0], health_source=new[1], health_since_utc=now))
    return bool(done.rowcount)


def latest_metric_minute(s: Session) -> dt.datetime | None:
    """The newest minute any GPU has metrics for (None before the first)."""
    return s.scalar(select(func.max(m.GpuMetricMinute.minute_utc)))


def online_service_summary(s: Session, since_utc: dt.datetime, until_utc: dt.datetime | None = None) -> list[dict]:
    """Per online service, its replicas' own (solo) load since ``since_utc``: the features the predictor sees."""
    mt = m.GpuMetricMinute
    q = (
        select(
            m.OnlineService.name, m.OnlineService.model_family, func.count(func.distinct(mt.gpu_id)),
            func.avg(mt.online_qps), func.avg(mt.online_gpu_util_pct), func.avg(mt.online_sm_activity_pct),
            func.avg(mt.online_mem_used_bytes), func.avg(mt.online_solo_latency_ms), func.count(),
        )
        .join(m.ServiceInstance, m.ServiceInstance.gpu_id == mt.gpu_id)
        .join(m.OnlineService, m.OnlineService.id == m.ServiceInstance.service_id)
        .where(mt.minute_utc >= since_utc)
        .group_by(m.OnlineService.name, m.OnlineService.model_family)
        .order_by(m.OnlineService.name)
    )
    if until_utc is not None:
        q = q.where(mt.minute_utc < until_utc)
    keys = ("service", "family", "gpus", "qps", "gpu_util_pct", "sm_activity_pct", "mem_used_bytes",
            "solo_latency_ms", "samples")
    return [dict(zip(keys, row)) for row in s.execute(q)]


def predicted_vs_realised(s: Session, round_id: int) -> list[dict]:
    """Per placement of a round: predicted normalized throughput and what the cluster realised in its window."""
    ex = (
        select(m.JobExecution.job_id, func.sum(m.JobExecution.solo_equiv_s).label("solo"),
               func.sum(m.JobExecution.wall_s).label("wall"))
        .where(m.JobExecution.round_id == round_id)
        .group_by(m.JobExecution.job_id)
        .subquery()
    )
    rows = s.execute(
        select(m.Placement.job_id, m.Placement.gpu_id, m.Placement.action, m.Placement.predicted_norm_tput,
               ex.c.solo, ex.c.wall)
        .join(ex, ex.c.job_id == m.Placement.job_id)
        .where(m.Placement.round_id == round_id)
        .order_by(m.Placement.job_id)
    ).all()
    return [
        {"job_id": j, "gpu_id": g, "action": a, "predicted": float(p), "realised": float(solo) / float(wall)}
        for j, g, a, p, solo, wall in rows if wall and wall > 0
    ]


def _finite_or_none(x: float | None) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def _json_safe(d: dict) -> dict:
    """Solver statistics as plain JSON (numpy scalars → Python, non-finite → None)."""
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out[str(k)] = _json_safe(v)
        elif isinstance(v, (bool, np.bool_)):
            out[str(k)] = bool(v)
        elif isinstance(v, (int, np.integer)):
            out[str(k)] = int(v)
        elif isinstance(v, (float, np.floating)):
            out[str(k)] = float(v) if np.isfinite(v) else None
        elif isinstance(v, (str, type(None))):
            out[str(k)] = v
        else:
            out[str(k)] = str(v)
    return out
