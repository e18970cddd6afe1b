"""What the scheduler's metrics endpoint reads from the feature store (executors.scheduler.metrics): one snapshot
per scrape, in one read-only transaction."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from executors.store import models as m


@dataclass(frozen=True)
class RoundFigures:
    """The latest finished round (a window's round or one of its fills)."""

    round_id: int
    window_start_utc: dt.datetime
    seq: int
    status: str
    started_utc: dt.datetime
    finished_utc: dt.datetime
    period_s: int
    objective: float
    certified_optimal: bool
    optimality_gap_bound: float | None
    predicted_oversold: float | None
    action_counts: dict[str, int]
    unplaced: dict[str, int]          # reason → jobs the round did not place
    simulated: bool


@dataclass(frozen=True)
class SchedulerSnapshot:
    last_round: RoundFigures | None
    rounds_by_status: dict[str, int]
    jobs_by_state: dict[str, int]
    oldest_pending_since_utc: dt.datetime | None
    dispatch: dict[tuple[str, str], int]            # (action, status) → dispatch log rows
    predicted_tput: dict[str, float] = field(default_factory=dict)   # GPU type → mean predicted, latest round
    realized_tput: dict[str, float] = field(default_factory=dict)    # GPU type → solo-equivalent / wall, last hour
    evictions: dict[str, int] = field(default_factory=dict)          # GPU type → evictions recorded
    services: list[ServiceDay] = field(default_factory=list)
    migrations: list[JobMigrations] = field(default_factory=list)    # jobs not yet ended that were migrated


@dataclass(frozen=True)
class ServiceDay:
    """A service's requests so far today (UTC), request-weighted as a slowdown budget bounds them."""

    name: str
    slowdown_allowance: float
    slowdown_budget: float | None
    requests: float
    slowdown: float | None          # SUM(rate x latency) / SUM(rate x solo latency) - 1


@dataclass(frozen=True)
class JobMigrations:
    job_id: int
    slurm_job_id: int | None
    user: str
    migrations: int


def scheduler_snapshot(s: Session, now: dt.datetime, realized_window_s: float = 3600.0) -> SchedulerSnapshot:
    last = s.scalars(select(m.SchedulingRound).where(m.SchedulingRound.finished_utc.is_not(None))
                     .order_by(m.SchedulingRound.finished_utc.desc(), m.SchedulingRound.id.desc()).limit(1)).first()
    figures = None
    predicted: dict[str, float] = {}
    if last is not None:
        unplaced = ((last.stats or {}).get("unplaced") or {}).get("counts") or {}
        figures = RoundFigures(
            last.id, last.window_start_utc, last.seq, last.status, last.started_utc, last.finished_utc,
            last.period_s, float(last.objective or 0.0), bool(last.certified_optimal), last.optimality_gap_bound,
            last.predicted_oversold, {str(k): int(v) for k, v in (last.action_counts or {}).items()},
            {str(k): int(v) for k, v in unplaced.items() if isinstance(v, int | float)}, bool(last.simulated))
        predicted = {t: float(v) for t, v in s.execute(
            select(m.Gpu.gpu_type, func.avg(m.Placement.predicted_norm_tput)).select_from(m.Placement)
            .join(m.Gpu, m.Gpu.id == m.Placement.gpu_id)
            .where(m.Placement.round_id == last.id).group_by(m.Gpu.gpu_type))}
    since = now - dt.timedelta(seconds=realized_window_s)
    realized = {t: float(solo) / float(wall) for t, solo, wall in s.execute(
        select(m.Gpu.gpu_type, func.sum(m.JobExecution.solo_equiv_s), func.sum(m.JobExecution.wall_s))
        .select_from(m.JobExecution).join(m.Gpu, m.Gpu.id == m.JobExecution.gpu_id)
        .where(m.JobExecution.end_utc >= since).group_by(m.Gpu.gpu_type)) if wall and wall > 0}
    return SchedulerSnapshot(
        last_round=figures,
        rounds_by_status=_pairs(s.execute(select(m.SchedulingRound.status, func.count())
                                          .group_by(m.SchedulingRound.status))),
        jobs_by_state=_pairs(s.execute(select(m.OfflineJob.state, func.count()).group_by(m.OfflineJob.state))),
        oldest_pending_since_utc=_oldest_pending(s),
        dispatch={(a, st): n for a, st, n in s.execute(
            select(m.DispatchLog.action, m.DispatchLog.status, func.count())
            .group_by(m.DispatchLog.action, m.DispatchLog.status))},
        predicted_tput=predicted, realized_tput=realized,
        services=_service_days(s, now), migrations=_migrations(s),
        evictions=_pairs(s.execute(select(m.Gpu.gpu_type, func.count()).select_from(m.Eviction)
                                   .join(m.Gpu, m.Gpu.id == m.Eviction.gpu_id).group_by(m.Gpu.gpu_type))),
    )


def _oldest_pending(s: Session) -> dt.datetime | None:
    """Since when the longest-waiting PENDING job waits: its latest move to PENDING (its submission without one)."""
    since = (select(m.JobTransition.job_id, func.max(m.JobTransition.at_utc).label("at"))
             .where(m.JobTransition.to_state == "PENDING").group_by(m.JobTransition.job_id).subquery())
    return s.scalar(select(func.min(func.coalesce(since.c.at, m.OfflineJob.submitted_utc)))
                    .select_from(m.OfflineJob).outerjoin(since, since.c.job_id == m.OfflineJob.id)
                    .where(m.OfflineJob.state == "PENDING"))


def _pairs(result) -> dict[str, int]:
    return {str(k): int(n) for k, n in result}


def _service_days(s: Session, now: dt.datetime) -> list[ServiceDay]:
    day = now.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    mm = m.GpuMetricMinute
    rows = s.execute(
        select(m.OnlineService.name, m.OnlineService.slowdown_allowance, m.OnlineService.slowdown_budget,
               func.sum(mm.online_qps), func.sum(mm.online_qps * mm.online_latency_ms),
               func.sum(mm.online_qps * mm.online_solo_latency_ms))
        .select_from(m.OnlineService)
        .join(m.ServiceInstance, m.ServiceInstance.service_id == m.OnlineService.id)
        .outerjoin(mm, (mm.gpu_id == m.ServiceInstance.gpu_id) & (mm.minute_utc >= day)
                   & mm.online_qps.is_not(None) & mm.online_latency_ms.is_not(None)
                   & mm.online_solo_latency_ms.is_not(None))
        .group_by(m.OnlineService.name, m.OnlineService.slowdown_allowance, m.OnlineService.slowdown_budget)
        .order_by(m.OnlineService.name))
    return [ServiceDay(name, float(allow), None if budget is None else float(budget), 60.0 * float(qps or 0.0),
                       float(lat) / float(solo) - 1.0 if lat is not None and solo else None)
            for name, allow, budget, qps, lat, solo in rows]


def _migrations(s: Session) -> list[JobMigrations]:
    rows = s.execute(
        select(m.OfflineJob.id, m.OfflineJob.slurm_job_id, m.OfflineJob.run_as_user, func.count())
        .select_from(m.Placement).join(m.OfflineJob, m.OfflineJob.id == m.Placement.job_id)
        .where(m.Placement.action == "migrate", m.OfflineJob.state.not_in(("DONE", "FAILED", "CANCELLED")))
        .group_by(m.OfflineJob.id, m.OfflineJob.slurm_job_id, m.OfflineJob.run_as_user)
        .order_by(m.OfflineJob.id))
    return [JobMigrations(j, sid, user or "", int(n)) for j, sid, user, n in rows]
