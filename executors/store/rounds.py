"""Store queries about scheduling rounds: find a round, read its plan back, and its window's figures."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from executors.store import models as m
from scheduler_core.domain import Action, JobState, PlanAction, PlannedPlacement, RoundResult


def latest_round_window(s: Session) -> dt.datetime | None:
    return s.scalar(select(func.max(m.SchedulingRound.window_start_utc)))


def round_for_window(s: Session, window_start: dt.datetime) -> m.SchedulingRound | None:
    """The window's round (not its fills)."""
    return s.scalars(select(m.SchedulingRound).where(m.SchedulingRound.window_start_utc == window_start,
                                                     m.SchedulingRound.seq == 0)).first()


def fills_of_window(s: Session, window_start: dt.datetime) -> list[m.SchedulingRound]:
    """The window's fills (placements between its round and the next), in order."""
    return list(s.scalars(select(m.SchedulingRound).where(m.SchedulingRound.window_start_utc == window_start,
                                                          m.SchedulingRound.seq > 0)
                          .order_by(m.SchedulingRound.seq)))


def undispatched_fill(s: Session) -> m.SchedulingRound | None:
    """The latest row, when it is a fill whose dispatch has not finished (to be sent again, not re-planned)."""
    rnd = s.scalars(select(m.SchedulingRound).order_by(m.SchedulingRound.id.desc()).limit(1)).first()
    return rnd if rnd is not None and rnd.seq > 0 and rnd.status == "planned" else None


def later_rounds(s: Session, window_start: dt.datetime) -> int:
    return s.scalar(select(func.count()).select_from(m.SchedulingRound)
                    .where(m.SchedulingRound.window_start_utc > window_start)) or 0


def latest_round(s: Session) -> m.SchedulingRound | None:
    """The round of the latest window (not its fills)."""
    return s.scalars(select(m.SchedulingRound).where(m.SchedulingRound.seq == 0)
                     .order_by(m.SchedulingRound.window_start_utc.desc()).limit(1)).first()


def round_snapshot_values(s: Session, key: str, since: dt.datetime,
                          now: dt.datetime) -> list[tuple[dt.datetime, object]]:
    """(window start, ``snapshot[key]``) of each round (not its fills) whose window can cover a minute in
    [``since``, ``now``), oldest first; only that key of the snapshots is read."""
    longest = s.scalar(select(func.max(m.SchedulingRound.period_s))) or 0
    rows = s.execute(select(m.SchedulingRound.window_start_utc, m.SchedulingRound.snapshot[key])
                     .where(m.SchedulingRound.seq == 0, m.SchedulingRound.window_start_utc < now,
                            m.SchedulingRound.window_start_utc > since - dt.timedelta(seconds=int(longest)))
                     .order_by(m.SchedulingRound.window_start_utc)).all()
    return [(start if start.tzinfo else start.replace(tzinfo=dt.timezone.utc), value) for start, value in rows]


def round_at(s: Session, at_utc: dt.datetime) -> int | None:
    """The id of the round whose window ``at_utc`` falls in (the latest that started by then; not a fill)."""
    return s.scalar(select(m.SchedulingRound.id).where(m.SchedulingRound.window_start_utc <= at_utc,
                                                       m.SchedulingRound.seq == 0)
                    .order_by(m.SchedulingRound.window_start_utc.desc()).limit(1))


def round_placements(s: Session, round_id: int) -> list[m.Placement]:
    """The round's placements, by job id."""
    return list(s.scalars(select(m.Placement).where(m.Placement.round_id == round_id).order_by(m.Placement.job_id)))


def _last_placement_of_each_job(*where):
    """(job, the newest round — or fill — that placed it, among the placements ``where`` selects), to join
    ``placements`` on: each job's latest placement."""
    last = (select(m.Placement.job_id, func.max(m.Placement.round_id).label("r"))
            .where(*where).group_by(m.Placement.job_id).subquery())
    return last, (m.Placement.job_id == last.c.job_id) & (m.Placement.round_id == last.c.r)


def latest_placements(s: Session, job_ids: list[int]) -> dict[int, m.Placement]:
    """Each job's placement by the latest round that placed it (jobs never placed are left out)."""
    last, on = _last_placement_of_each_job(m.Placement.job_id.in_(job_ids))
    return {p.job_id: p for p in s.scalars(select(m.Placement).join(last, on))}


def planned_mem_quotas(s: Session, round_id: int, job_ids: list[int]) -> dict[int, int]:
    """The GPU-memory quota the round planned for each of these jobs it placed."""
    return {j: int(q) for j, q in s.execute(select(m.Placement.job_id, m.Placement.mem_quota_bytes).where(
        m.Placement.round_id == round_id, m.Placement.job_id.in_(job_ids)))}


@dataclass(frozen=True)
class RunningPlacement:
    """A RUNNING job where the latest dispatched round placed it."""

    job_id: int
    slurm_job_id: int | None
    gpu_id: int
    sm_pct: int
    started_utc: dt.datetime | None


def running_in_latest_dispatch(s: Session, gpu_ids: list[int]) -> list[RunningPlacement]:
    """The RUNNING jobs whose latest dispatched placement (by the latest round, or a fill after it) is on these
    GPUs, by job id (none before a dispatch). A job the latest round placed is where that round put it; a job
    a fill started since is where the fill put it."""
    latest = s.scalar(select(func.max(m.SchedulingRound.id)).where(m.SchedulingRound.status == "dispatched",
                                                                  m.SchedulingRound.seq == 0))
    if latest is None:
        return []
    # The latest round and the fills dispatched after it; a job's latest placement among them.
    since = (select(m.SchedulingRound.id).where(m.SchedulingRound.status == "dispatched",
                                                m.SchedulingRound.id >= latest).scalar_subquery())
    last, on = _last_placement_of_each_job(m.Placement.round_id.in_(since))
    rows = s.execute(
        select(m.Placement.job_id, m.OfflineJob.slurm_job_id, m.Placement.gpu_id, m.Placement.sm_pct,
               m.OfflineJob.started_utc)
        .join(last, on)
        .join(m.OfflineJob, m.OfflineJob.id == m.Placement.job_id)
        .where(m.Placement.gpu_id.in_(gpu_ids), m.OfflineJob.state == JobState.RUNNING.value)
        .order_by(m.Placement.job_id))
    return [RunningPlacement(*r) for r in rows]


def stored_result(s: Session, rnd: m.SchedulingRound) -> RoundResult:
    """A stored round's plan as the core's :class:`RoundResult` (placements, actions, objective)."""
    rows = round_placements(s, rnd.id)
    placements = [
        PlannedPlacement(p.job_id, p.gpu_id, p.sm_pct, p.mem_quota_bytes, p.predicted_norm_tput,
                         p.predicted_online_slowdown, p.slot)
        for p in rows
    ]
    actions = [
        PlanAction(Action(a["action"]), a["job_id"], a["gpu_id"], a["from_gpu_id"], a["sm_pct"])
        for a in rnd.plan_actions or []
    ]
    jobs = len(rnd.snapshot.get("jobs", [])) if rnd.snapshot else 0
    return RoundResult(placements, actions, rnd.objective, rnd.gpus_considered, jobs, rnd.feasible_pairs,
                       dict(rnd.timings_s or {}), stats=dict(rnd.stats or {}))


def dispatch_counts(s: Session, round_id: int) -> dict[str, int]:
    """The round's dispatch log by status (intent, sent, done, failed)."""
    return dict(s.execute(select(m.DispatchLog.status, func.count()).where(m.DispatchLog.round_id == round_id)
                          .group_by(m.DispatchLog.status)).all())


@dataclass(frozen=True)
class WindowFigures:
    """What was booked for a round's window: executions, evictions and completions."""

    executions: int
    wall_s: float
    solo_equiv_s: float
    evictions: int
    completed: int

    @property
    def oversold(self) -> float | None:
        """Oversold GPU realised over the window's executions (docs/DESIGN.md §9)."""
        return self.solo_equiv_s / self.wall_s if self.wall_s > 0 else None


def window_figures(s: Session, round_id: int, window_start: dt.datetime, window_end: dt.datetime) -> WindowFigures:
    wall, solo, n_ex = s.execute(
        select(func.sum(m.JobExecution.wall_s), func.sum(m.JobExecution.solo_equiv_s), func.count())
        .where(m.JobExecution.round_id == round_id)).one()
    evictions = s.scalar(select(func.count()).select_from(m.Eviction)
                         .where(m.Eviction.at_utc > window_start, m.Eviction.at_utc <= window_end))
    completed = s.scalar(select(func.count()).select_from(m.JobTransition)
                         .where(m.JobTransition.to_state == "DONE", m.JobTransition.at_utc > window_start,
                                m.JobTransition.at_utc <= window_end))
    return WindowFigures(int(n_ex or 0), float(wall or 0.0), float(solo or 0.0), int(evictions or 0),
                         int(completed or 0))
