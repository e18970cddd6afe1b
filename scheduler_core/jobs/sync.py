"""What the store must do when the cluster's view of a job differs from its own (pure).

The cluster (Slurm) is the authority on whether a job runs, finished or was
requeued; the store is the authority on what MuxFlow decided. One function,
:func:`decide`, maps the store's state of a job and what the cluster reports
about it to the state changes that make the store true again, in order, plus
what the cluster itself must still be told (hold the job, so that Slurm's own
scheduler never restarts a job MuxFlow did not place). The adapter that reads
the cluster applies them with compare-and-set transitions, so running it twice,
or after a crash half-way, changes nothing more (docs/DESIGN.md §3 steps 6–9).
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from scheduler_core.domain import JobState


class Seen(str, enum.Enum):
    """A job as the cluster reports it, in the terms the store cares about."""

    ABSENT = "absent"        # the cluster no longer knows the job (cancelled and purged, or never there)
    HELD = "held"            # waiting, and held: nothing starts it but a release
    WAITING = "waiting"      # waiting, released: the cluster will start it when it fits
    RUNNING = "running"
    COMPLETED = "completed"  # ended with exit code 0
    FAILED = "failed"        # ended otherwise (non-zero exit, timeout, out of memory, node failure …)
    CANCELLED = "cancelled"
    # between two states (being requeued, or a state this code does not know): nothing is decided until it
    # settles — a job is never failed for a state that is not an end
    CHANGING = "changing"


ENDED = frozenset({Seen.COMPLETED, Seen.FAILED, Seen.CANCELLED})


@dataclass(frozen=True)
class ClusterView:
    seen: Seen
    reason: str = ""                     # the cluster's own words (Slurm state and reason)
    exit_code: int | None = None
    started_utc: dt.datetime | None = None
    ended_utc: dt.datetime | None = None
    # WAITING, but the cluster will not start it before a time still to come (Slurm: reason BeginTime)
    delayed: bool = False


@dataclass(frozen=True)
class Step:
    target: JobState
    reason: str
    at_utc: dt.datetime | None = None    # None: when the change is applied


@dataclass(frozen=True)
class Decision:
    steps: tuple[Step, ...] = ()
    hold: bool = False          # make the job held in the cluster (checkpoint + requeue-hold if it runs)
    run_ended: bool = False     # a stretch of running ended: book it as an execution
    exit_code: int | None = None
    # tell the cluster to start the job as soon as it fits: a job MuxFlow released that the cluster delayed
    # afterwards (Slurm pushes a requeued job's begin time 2 min ahead when it finishes the requeue, which can be
    # after the release that made it eligible now)
    make_eligible: bool = False

    @property
    def changes(self) -> bool:
        return bool(self.steps) or self.hold or self.make_eligible


NOTHING = Decision()


def _end(view: ClusterView, via_running: bool, started_reason: str) -> Decision:
    """A job that ended in the cluster: DONE or FAILED, through RUNNING when the store never saw it run."""
    steps: list[Step] = []
    ran = view.seen != Seen.CANCELLED or view.started_utc is not None
    if via_running and ran:
        steps.append(Step(JobState.RUNNING, started_reason, view.started_utc))
    if view.seen == Seen.COMPLETED:
        steps.append(Step(JobState.DONE, f"finished in the cluster ({view.reason or 'COMPLETED'}, exit code 0)",
                          view.ended_utc))
    else:
        what = "cancelled in the cluster" if view.seen == Seen.CANCELLED else "failed in the cluster"
        code = "" if view.exit_code is None else f", exit code {view.exit_code}"
        steps.append(Step(JobState.FAILED, f"{what} ({view.reason or view.seen.value}{code})", view.ended_utc))
    return Decision(tuple(steps), run_ended=True, exit_code=view.exit_code)


def decide(state: JobState, view: ClusterView) -> Decision:
    """The store changes (and cluster hold) that bring a job in ``state`` in line with ``view``.

    MIGRATING and the finished states are left alone: a move is the dispatcher's
    (it never commits MIGRATING on its own), and nothing leaves DONE or FAILED.
    """
    seen = view.seen
    started = f"started in the cluster ({view.reason})" if view.reason else "started in the cluster"
    if state in (JobState.DONE, JobState.FAILED, JobState.MIGRATING) or seen == Seen.CHANGING:
        return NOTHING
    if state in (JobState.SUBMITTED, JobState.PROFILING):
        # Not placed yet: only its end matters (the user cancelled it, or it is gone); its profiling stops.
        # A held, waiting or running job is the profiler's and the pick-up's business, not the sync's: a job is
        # profiled in its own Slurm job (a profiling window), and may end there, to DONE or FAILED as it ended.
        if state == JobState.PROFILING and view.started_utc is not None and seen in (Seen.COMPLETED, Seen.FAILED):
            if seen == Seen.COMPLETED:
                return Decision((Step(JobState.DONE, "finished in the cluster during its profiling window "
                                                     f"({view.reason or 'COMPLETED'}, exit code 0)", view.ended_utc),),
                                exit_code=view.exit_code)
            code = "" if view.exit_code is None else f", exit code {view.exit_code}"
            return Decision((Step(JobState.FAILED, "failed in the cluster during its profiling window "
                                                   f"({view.reason or seen.value}{code})", view.ended_utc),),
                            exit_code=view.exit_code)
        if seen in ENDED or seen == Seen.ABSENT:
            what = "no longer known to the cluster" if seen == Seen.ABSENT else (
                "cancelled in the cluster" if seen == Seen.CANCELLED else "ended in the cluster")
            return Decision((Step(JobState.FAILED, f"{what} before it was placed ({view.reason or seen.value})",
                                  view.ended_utc),))
        return NOTHING
    if seen == Seen.ABSENT:
        return Decision((Step(JobState.FAILED, "the cluster no longer knows its job "
                                               f"({view.reason or 'cancelled and purged?'})"),),
                        run_ended=state == JobState.RUNNING)

    if state == JobState.PENDING:
        # Released or started without a booked placement: a dispatcher that crashed between
        # Slurm's answer and the store's record, or an administrator. The store follows Slurm.
        if seen == Seen.WAITING:  # PLACED: booked as started when it fits, so a delayed one is made eligible too
            return Decision((Step(JobState.PLACED, "found released in the cluster (adopted)"),),
                            make_eligible=view.delayed)
        if seen == Seen.RUNNING:
            return Decision((Step(JobState.RUNNING, f"{started} (adopted)", view.started_utc),))
        if seen in ENDED:
            return _end(view, via_running=True, started_reason=f"{started} (adopted)")
        return NOTHING

    if state == JobState.PLACED:
        if seen == Seen.HELD:
            return Decision((Step(JobState.PENDING, f"held again in the cluster before it started ({view.reason})"),))
        if seen == Seen.RUNNING:
            return Decision((Step(JobState.RUNNING, started, view.started_utc),))
        if seen in ENDED:
            return _end(view, via_running=True, started_reason=started)
        if seen == Seen.WAITING and view.delayed:
            return Decision(make_eligible=True)
        return NOTHING

    if state == JobState.RUNNING:
        if seen == Seen.HELD:
            return Decision((Step(JobState.PENDING, f"requeued held in the cluster ({view.reason})", view.ended_utc),),
                            run_ended=True)
        if seen == Seen.WAITING:
            # Slurm requeued it on its own (node failure, slurmd restart): hold it, so only a
            # round places it again, and back to the queue.
            return Decision((Step(JobState.PENDING, f"requeued by the cluster ({view.reason})", view.ended_utc),),
                            hold=True, run_ended=True)
        if seen in ENDED:
            return _end(view, via_running=False, started_reason=started)
        return NOTHING

    if state == JobState.EVICTED:
        if seen == Seen.HELD:
            return Decision((Step(JobState.PENDING, "requeued held after eviction"),))
        if seen in (Seen.RUNNING, Seen.WAITING):
            # The eviction's requeue-hold has not taken effect (it failed, or is still under way): hold it.
            return Decision((Step(JobState.PENDING, f"held after eviction ({view.reason})"),), hold=True)
        if seen in ENDED:
            if seen == Seen.COMPLETED:
                return Decision((Step(JobState.PENDING, "finished in the cluster while being evicted"),
                                 Step(JobState.RUNNING, started, view.started_utc),
                                 Step(JobState.DONE, f"finished in the cluster ({view.reason or 'COMPLETED'}, "
                                                     "exit code 0)", view.ended_utc)),
                                exit_code=view.exit_code)
            return _end(view, via_running=False, started_reason=started)
        return NOTHING
    return NOTHING
