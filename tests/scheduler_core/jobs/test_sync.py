"""What the store does when the cluster's view of a job differs: every decision, legality, and that it settles."""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_core.domain import JOB_TRANSITIONS, JobState
from scheduler_core.jobs.sync import ENDED, ClusterView, Seen, decide

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
T1 = T0 + dt.timedelta(minutes=7)
S = JobState


def view(seen: Seen, exit_code: int | None = None) -> ClusterView:
    ran = seen in (Seen.RUNNING, *ENDED)
    return ClusterView(seen, seen.value.upper(), exit_code, T0 if ran else None, T1 if seen in ENDED else None)


CASES = [
    # store state, cluster view, expected targets, hold, run ended
    (S.PLACED, view(Seen.WAITING), [], False, False),
    (S.PLACED, view(Seen.RUNNING), [S.RUNNING], False, False),
    (S.PLACED, view(Seen.HELD), [S.PENDING], False, False),
    (S.PLACED, view(Seen.COMPLETED, 0), [S.RUNNING, S.DONE], False, True),
    (S.PLACED, view(Seen.FAILED, 1), [S.RUNNING, S.FAILED], False, True),
    (S.PLACED, ClusterView(Seen.CANCELLED, "CANCELLED"), [S.FAILED], False, True),
    (S.RUNNING, view(Seen.RUNNING), [], False, False),
    (S.RUNNING, view(Seen.COMPLETED, 0), [S.DONE], False, True),
    (S.RUNNING, view(Seen.FAILED, 137), [S.FAILED], False, True),
    (S.RUNNING, view(Seen.HELD), [S.PENDING], False, True),
    (S.RUNNING, view(Seen.WAITING), [S.PENDING], True, True),
    (S.RUNNING, view(Seen.ABSENT), [S.FAILED], False, True),
    (S.EVICTED, view(Seen.HELD), [S.PENDING], False, False),
    (S.EVICTED, view(Seen.RUNNING), [S.PENDING], True, False),
    (S.EVICTED, view(Seen.COMPLETED, 0), [S.PENDING, S.RUNNING, S.DONE], False, False),
    (S.PENDING, view(Seen.HELD), [], False, False),
    (S.PENDING, view(Seen.WAITING), [S.PLACED], False, False),
    (S.PENDING, view(Seen.RUNNING), [S.RUNNING], False, False),
    (S.PENDING, view(Seen.ABSENT), [S.FAILED], False, False),
    (S.SUBMITTED, view(Seen.HELD), [], False, False),
    (S.SUBMITTED, ClusterView(Seen.CANCELLED, "CANCELLED"), [S.FAILED], False, False),
    (S.SUBMITTED, view(Seen.ABSENT), [S.FAILED], False, False),
    (S.PROFILING, view(Seen.HELD), [], False, False),
    (S.PROFILING, view(Seen.WAITING), [], False, False),
    (S.PROFILING, ClusterView(Seen.CANCELLED, "CANCELLED"), [S.FAILED], False, False),
    (S.PROFILING, view(Seen.FAILED, 1), [S.FAILED], False, False),
    (S.MIGRATING, view(Seen.HELD), [], False, False),
    # being requeued (Slurm's REQUEUED, REQUEUE_HOLD …), or a state the code does not know: never an end
    (S.RUNNING, view(Seen.CHANGING), [], False, False),
    (S.PLACED, view(Seen.CHANGING), [], False, False),
    (S.EVICTED, view(Seen.CHANGING), [], False, False),
    (S.PROFILING, view(Seen.CHANGING), [], False, False),
    (S.DONE, view(Seen.ABSENT), [], False, False),
]


@pytest.mark.parametrize(("state", "v", "targets", "hold", "ended"), CASES)
def test_each_state_and_view(state, v, targets, hold, ended) -> None:
    d = decide(state, v)
    assert [x.target for x in d.steps] == targets
    assert (d.hold, d.run_ended) == (hold, ended)


def test_times_and_reasons_come_from_the_cluster() -> None:
    d = decide(S.PLACED, view(Seen.FAILED, 2))
    assert d.steps[0].at_utc == T0 and d.steps[1].at_utc == T1
    assert "exit code 2" in d.steps[1].reason and d.exit_code == 2
    assert decide(S.RUNNING, view(Seen.COMPLETED, 0)).steps[0].reason.startswith("finished in the cluster")
    cancelled = decide(S.PROFILING, ClusterView(Seen.CANCELLED, "CANCELLED", ended_utc=T1)).steps[0]
    assert cancelled.reason == "cancelled in the cluster before it was placed (CANCELLED)" and cancelled.at_utc == T1


def test_only_a_placed_job_the_cluster_delayed_is_made_eligible() -> None:
    delayed = replace(view(Seen.WAITING), delayed=True)
    d = decide(S.PLACED, delayed)
    assert d.make_eligible and d.changes and not d.steps and not d.hold
    assert not decide(S.PLACED, view(Seen.WAITING)).changes  # released, waiting for room: nothing to do
    assert decide(S.PENDING, delayed).make_eligible  # released by someone else: adopted as PLACED, so eligible too
    # Believed running (Slurm's own requeue: held instead), or not the rounds' yet: never made eligible
    for state in set(JobState) - {S.PLACED, S.PENDING}:
        assert not decide(state, delayed).make_eligible, state
    assert decide(S.RUNNING, delayed).hold


@given(st.sampled_from(list(JobState)), st.sampled_from(list(Seen)), st.sampled_from([None, 0, 1]), st.booleans())
def test_every_decision_is_a_legal_path_and_settles(state: JobState, seen: Seen, code: int | None,
                                                    delayed: bool) -> None:
    v = replace(view(seen, code), delayed=delayed and seen == Seen.WAITING)
    d = decide(state, v)
    current = state
    for step in d.steps:
        assert step.target in JOB_TRANSITIONS[current], (state, seen, step)
        current = step.target
    # Once applied (and the hold carried out, after which the cluster shows the job held), the same view
    # asks for nothing more: running the sync twice changes nothing.
    # Made eligible, it is no longer delayed.
    after = ClusterView(Seen.HELD, "held") if d.hold else replace(v, delayed=v.delayed and not d.make_eligible)
    again = decide(current, after)
    assert not again.changes, (state, seen, current, again)


def test_every_state_view_pair_is_covered_by_a_rule_or_left_alone() -> None:
    for state, seen in itertools.product(JobState, Seen):
        decide(state, view(seen))  # no combination raises
