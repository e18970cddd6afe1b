"""The dispatch log in the store (docs/DESIGN.md §3 step 6): one row per planned action, keyed so that a dispatch
repeated after a crash finds what was already sent.

A row is written as ``intent`` before anything reaches the cluster, becomes ``sent`` once the cluster took
it, and ends ``done`` or ``failed``. Each function takes the caller's session.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from executors.store import models as m
from scheduler_core.domain import PlanAction

# Actions written but without a result: sent again by the next dispatch of their round.
UNFINISHED = ("intent", "sent")


def round_log(s: Session, round_id: int) -> list[m.DispatchLog]:
    """The round's dispatch log, in the order it was written."""
    return list(s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == round_id)
                          .order_by(m.DispatchLog.id)))


def log_by_key(s: Session, round_id: int) -> dict[str, m.DispatchLog]:
    """The round's dispatch log by action key, in one query (keys name their round)."""
    return {r.action_key: r for r in round_log(s, round_id)}


def add_intent(s: Session, round_id: int, key: str, act: PlanAction) -> m.DispatchLog:
    """The ``intent`` row of an action about to be sent."""
    row = m.DispatchLog(round_id=round_id, action_key=key, action=act.action.value, job_id=act.job_id,
                        gpu_id=act.gpu_id, payload={"sm_pct": act.sm_pct, "from_gpu_id": act.from_gpu_id})
    s.add(row)
    return row


def mark_sent(s: Session, key: str) -> None:
    """The cluster took the action: an ``intent`` row becomes ``sent`` (a row with a result keeps it)."""
    row = s.scalars(select(m.DispatchLog).where(m.DispatchLog.action_key == key)).first()
    if row is not None and row.status == "intent":
        row.status, row.error = "sent", None


def note_unfinished(s: Session, round_id: int, error: str) -> None:
    """Record on each of the round's unfinished actions why it is still pending."""
    for row in s.scalars(select(m.DispatchLog).where(m.DispatchLog.round_id == round_id,
                                                     m.DispatchLog.status.in_(UNFINISHED))):
        row.error = error[:2000]
