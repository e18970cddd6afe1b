"""Job-state repository: the only writer of ``offline_jobs.state`` (DESIGN §3).

Every change goes through :func:`transition`, which validates it against the
state machine in ``scheduler_core.domain`` and stores it with a compare-and-set
so that two writers (a dispatcher and a node agent, or two dispatchers after a
restart) can never both move a job out of the same state.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import update
from sqlalchemy.orm import Session

from executors.store.models import JobTransition, OfflineJob, utcnow
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
