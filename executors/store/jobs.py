"""Job-state repository: the only writer of ``offline_jobs.state`` (docs/DESIGN.md §3).

Every change goes through :func:`transition`, which validates it against the
state machine in ``scheduler_core.domain`` and stores it with a compare-and-set
so that two writers (a dispatcher and a node agent, or two dispatchers after a
restart) can never both move a job out of the same state.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from executors.store.models import DispatchLog, JobTransition, OfflineJob, SchedulingRound, utcnow
from scheduler_core.domain import IllegalTransition, JobState, check_transition

log = logging.getLogger(__name__)

FINISHED_STATES = frozenset({JobState.DONE, JobState.FAILED})


class ConcurrentTransition(IllegalTransition):
    """The job left the state the caller saw before the change could be stored.

    A subclass of :class:`IllegalTransition` on purpose: from the caller's point
    of view the move it asked for is no longer legal, and code that already
    handles refused moves (e.g. a dispatcher skipping a job) handles a lost race
    correctly without knowing about it. Catch this class first to retry instead.
    """


def transition(
    session: Session,
    job_id: int,
    target: JobState,
    reason: str | None = None,
    *,
    expected: JobState | None = None,
    at_utc: dt.datetime | None = None,
) -> OfflineJob:
    """Move job ``job_id`` to ``target`` and record the move in ``job_transitions``.

    ``expected`` is the state the caller based its decision on (e.g. read in an
    earlier transaction); when given, the move is checked and stored from that
    state. ``at_utc`` overrides the clock (simulator, tests).

    Raises ``LookupError`` for an unknown job, :class:`IllegalTransition` for a
    move the state machine forbids, :class:`ConcurrentTransition` when the job
    is no longer in the state the move starts from. Nothing is written in any
    of these cases. The caller owns the transaction; the changes are flushed,
    not committed.
    """
    target = JobState(target)
    job = session.get(OfflineJob, job_id)
    if job is None:
        raise LookupError(f"no offline job with id {job_id}")
    seen = JobState(job.state)
    current = seen if expected is None else JobState(expected)
    check_transition(current, target)
    if seen is not current:
        raise ConcurrentTransition(
            f"job {job_id} is {seen.value}, not {current.value}: "
            f"refusing {current.value} -> {target.value}"
        )

    now = at_utc or utcnow()
    values: dict[str, object] = {"state": target.value, "state_reason": reason}
    # Only the first start counts; a job coming back from MIGRATING keeps it.
    # Safe to decide in Python: the compare-and-set below fails if anyone else
    # moved the job (and so could have set started_utc) since we read it.
    if target is JobState.RUNNING and job.started_utc is None:
        values["started_utc"] = now
    if target in FINISHED_STATES:
        values["finished_utc"] = now

    # The WHERE on state is the compare-and-set: on Postgres a concurrent writer
    # blocks on the row lock and then re-evaluates it against the committed row,
    # so exactly one of two racing updates matches.
    result = session.execute(
        update(OfflineJob)
        .where(OfflineJob.id == job_id, OfflineJob.state == current.value)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        raise ConcurrentTransition(
            f"job {job_id} left {current.value} before {current.value} -> {target.value} was stored"
        )
    session.add(
        JobTransition(
            job_id=job_id,
            from_state=current.value,
            to_state=target.value,
            reason=reason,
            at_utc=now,
        )
    )
    session.flush()
    # Reload so the returned object shows exactly what is stored (our UPDATE
    # bypassed the identity map).
    session.refresh(job)
    log.info("job %s: %s -> %s (%s)", job_id, current.value, target.value, reason or "no reason")
    return job


def live_cluster_jobs(session: Session, states) -> list[OfflineJob]:
    """Jobs in ``states`` that have a cluster (Slurm) job, oldest first."""
    return list(session.scalars(
        select(OfflineJob).where(OfflineJob.state.in_([JobState(x).value for x in states]),
                                 OfflineJob.slurm_job_id.is_not(None)).order_by(OfflineJob.id)))


def in_flight_job_ids(session: Session) -> set[int]:
    """Jobs a dispatcher is acting on now: actions logged but without a result in the latest round, if it
    is still being dispatched. Their state is the dispatcher's to book; nobody else moves them meanwhile.
    (Actions left without a result by a round that later rounds superseded are never sent again.)"""
    latest = session.scalars(select(SchedulingRound).where(
        SchedulingRound.id == select(func.max(SchedulingRound.id)).scalar_subquery())).first()
    if latest is None or latest.status != "planned":
        return set()
    return set(session.scalars(select(DispatchLog.job_id).where(
        DispatchLog.round_id == latest.id, DispatchLog.status.in_(["intent", "sent"]))))


def entered_at(session: Session, job_id: int, state: JobState) -> dt.datetime | None:
    """When the job last entered ``state`` (from the audit trail), in UTC."""
    return session.scalar(select(JobTransition.at_utc).where(
        JobTransition.job_id == job_id, JobTransition.to_state == JobState(state).value)
        .order_by(JobTransition.id.desc()).limit(1))


def last_transition_utc(session: Session, job_ids: list[int]) -> dict[int, dt.datetime]:
    """When each of these jobs last changed state (jobs never moved are left out)."""
    return dict(session.execute(select(JobTransition.job_id, func.max(JobTransition.at_utc))
                                .where(JobTransition.job_id.in_(job_ids)).group_by(JobTransition.job_id)).all())


def slurm_ids_and_memory(session: Session, job_ids: list[int]) -> dict[int, tuple[int | None, int]]:
    """Job id → (its Slurm job id or None, its declared GPU memory) for those of ``job_ids`` that exist."""
    return {j: (sid, mem) for j, sid, mem in session.execute(
        select(OfflineJob.id, OfflineJob.slurm_job_id, OfflineJob.mem_bytes).where(OfflineJob.id.in_(job_ids)))}


def jobs_of_slurm_ids(session: Session, slurm_job_ids) -> list[OfflineJob]:
    """The store's jobs of these Slurm job ids, by id."""
    return list(session.scalars(select(OfflineJob).where(OfflineJob.slurm_job_id.in_(list(slurm_job_ids)))
                                .order_by(OfflineJob.id)))


def rejected_slurm_ids(session: Session, reason_prefix: str) -> set[int]:
    """Slurm ids of the FAILED jobs whose reason starts with ``reason_prefix`` (submissions the pick-up refused)."""
    return set(session.scalars(select(OfflineJob.slurm_job_id).where(
        OfflineJob.state == JobState.FAILED.value, OfflineJob.state_reason.like(f"{reason_prefix}%"))))


def add_imported(store, row: OfflineJob) -> int | None:
    """Store a job picked up from the cluster; its id, or None when a job with its cluster id is stored already
    (another pick-up — the sensor, ``muxflow submit`` — stored it meanwhile: the cluster id is unique)."""
    try:
        with store.session() as s:
            s.add(row)
            s.flush()
            return row.id
    except IntegrityError:
        with store.session() as s:
            if s.scalar(select(OfflineJob.id).where(OfflineJob.slurm_job_id == row.slurm_job_id)) is None:
                raise
        return None
