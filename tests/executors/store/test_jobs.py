"""Job-state repository: legal moves stored and audited, illegal ones refused, races lost cleanly."""

from __future__ import annotations

import datetime as dt
import threading
from itertools import product

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from executors.store.db import Store
from executors.store.jobs import ConcurrentTransition, transition
from executors.store.models import JobTransition, OfflineJob
from scheduler_core.domain import JOB_TRANSITIONS, IllegalTransition, JobState

T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
LEGAL = [(src, dst) for src, dsts in JOB_TRANSITIONS.items() for dst in sorted(dsts)]
ILLEGAL = [(s, d) for s, d in product(JobState, JobState) if d not in JOB_TRANSITIONS[s]]


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    # SQLite hands DateTime(timezone=True) back naive (but stored as UTC).
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt.timezone.utc)


def _new_job(store: Store, state: JobState = JobState.SUBMITTED) -> int:
    with store.session() as s:
        job = OfflineJob(
            name="resnet50-bs64",
            job_type="resnet50",
            command="python train.py",
            mem_bytes=4 << 30,
            allowed_gpu_types=["A100"],
            checkpoint_dir="/ckpt/1",
            total_steps=1000,
            state=state.value,
        )
        s.add(job)
        s.flush()
        return job.id


def _snapshot(store: Store, job_id: int) -> tuple[str, int]:
    with store.session() as s:
        state = s.scalar(select(OfflineJob.state).where(OfflineJob.id == job_id))
        audits = s.scalar(select(func.count()).where(JobTransition.job_id == job_id))
    assert state is not None and audits is not None
    return state, audits


@pytest.mark.parametrize(("src", "dst"), LEGAL, ids=[f"{s.value}->{d.value}" for s, d in LEGAL])
def test_every_legal_transition_is_stored_with_an_audit_row(
    store: Store, src: JobState, dst: JobState
) -> None:
    job_id = _new_job(store, src)
    with store.session() as s:
        job = transition(s, job_id, dst, "because", at_utc=T0)
        assert job.state == dst.value
    with store.session() as s:
        job = s.get(OfflineJob, job_id)
        assert job is not None
        assert (job.state, job.state_reason) == (dst.value, "because")
        audit = s.scalars(select(JobTransition).where(JobTransition.job_id == job_id)).one()
        assert (audit.from_state, audit.to_state, audit.reason) == (src.value, dst.value, "because")
        assert _utc(audit.at_utc) == T0


def test_every_illegal_transition_raises_and_writes_nothing(store: Store) -> None:
    jobs = {state: _new_job(store, state) for state in JobState}
    for src, dst in ILLEGAL:
        with pytest.raises(IllegalTransition) as info, store.session() as s:
            transition(s, jobs[src], dst, "nope")
        assert not isinstance(info.value, ConcurrentTransition)
        assert _snapshot(store, jobs[src]) == (src.value, 0)


def test_unknown_job_is_a_lookup_error(store: Store) -> None:
    with pytest.raises(LookupError, match="12345"), store.session() as s:
        transition(s, 12345, JobState.PROFILING)


@settings(
    max_examples=40,
    deadline=None,
    database=None,  # keep the example database out of the working directory
    # Each example creates its own job, so the shared function-scoped store is fine.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), steps=st.integers(min_value=1, max_value=12))
def test_random_sequences_follow_the_state_machine(
    store: Store, data: st.DataObject, steps: int
) -> None:
    job_id = _new_job(store)
    state, audits = JobState.SUBMITTED, 0
    first_run: dt.datetime | None = None
    finished: dt.datetime | None = None
    for i in range(steps):
        # Mostly legal moves other than FAILED, sometimes anything: uniform
        # targets (and FAILED, legal everywhere and absorbing) would end most
        # runs early, and RUNNING/MIGRATING/DONE are where the timestamps live.
        progress = sorted(JOB_TRANSITIONS[state] - {JobState.FAILED})
        anything = st.sampled_from(list(JobState))
        choices = [st.sampled_from(progress)] * 3 + [anything] if progress else [anything]
        target = data.draw(st.one_of(choices))
        at = T0 + dt.timedelta(minutes=i)
        if target in JOB_TRANSITIONS[state]:
            with store.session() as s:
                transition(s, job_id, target, f"step {i}", at_utc=at)
            state, audits = target, audits + 1
            if target is JobState.RUNNING and first_run is None:
                first_run = at
            if target in (JobState.DONE, JobState.FAILED):
                finished = at
        else:
            with pytest.raises(IllegalTransition), store.session() as s:
                transition(s, job_id, target, f"step {i}", at_utc=at)
        assert _snapshot(store, job_id) == (state.value, audits)
    with store.session() as s:
        job = s.get(OfflineJob, job_id)
        assert job is not None
        assert (_utc(job.started_utc), _utc(job.finished_utc)) == (first_run, finished)
        trail = s.execute(
            select(JobTransition.from_state, JobTransition.to_state)
            .where(JobTransition.job_id == job_id)
            .order_by(JobTransition.id)
        ).all()
    # The audit trail is a connected path from SUBMITTED through legal moves.
    expected_from = JobState.SUBMITTED.value
    for from_state, to_state in trail:
        assert from_state == expected_from
        assert JobState(to_state) in JOB_TRANSITIONS[JobState(from_state)]
        expected_from = to_state
    assert expected_from == state.value
    event(f"ended {state.value}")  # shown by --hypothesis-show-statistics


def test_timestamps_first_running_and_finish(store: Store) -> None:
    job_id = _new_job(store, JobState.PENDING)
    steps = [
        (JobState.RUNNING, T0),
        (JobState.MIGRATING, T0 + dt.timedelta(minutes=15)),
        (JobState.RUNNING, T0 + dt.timedelta(minutes=16)),
        (JobState.DONE, T0 + dt.timedelta(hours=2)),
    ]
    for target, at in steps:
        with store.session() as s:
            job = transition(s, job_id, target, at_utc=at)
            assert _utc(job.started_utc) == T0  # the re-start after migrating keeps it
    assert _utc(job.finished_utc) == T0 + dt.timedelta(hours=2)
    assert job.state_reason is None


def test_default_clock_is_now_in_utc(store: Store) -> None:
    job_id = _new_job(store, JobState.PENDING)
    before = dt.datetime.now(dt.timezone.utc)
    with store.session() as s:
        job = transition(s, job_id, JobState.RUNNING)
    after = dt.datetime.now(dt.timezone.utc)
    started = _utc(job.started_utc)
    assert started is not None and before <= started <= after


def test_expected_state_mismatch_is_concurrent_and_writes_nothing(store: Store) -> None:
    job_id = _new_job(store, JobState.PROFILING)
    with pytest.raises(ConcurrentTransition), store.session() as s:
        transition(s, job_id, JobState.RUNNING, expected=JobState.PENDING)
    assert _snapshot(store, job_id) == (JobState.PROFILING.value, 0)
    # An illegal move from the expected state is reported as illegal, not as a race.
    with pytest.raises(IllegalTransition) as info, store.session() as s:
        transition(s, job_id, JobState.DONE, expected=JobState.PENDING)
    assert not isinstance(info.value, ConcurrentTransition)
    with store.session() as s:
        transition(s, job_id, JobState.PENDING, expected=JobState.PROFILING)
    assert _snapshot(store, job_id) == (JobState.PENDING.value, 1)


def test_stale_reader_loses_the_compare_and_set(store: Store) -> None:
    # B reads PENDING, A moves the job on and commits, then B acts on its stale
    # read: the UPDATE's WHERE state = 'PENDING' matches nothing.
    job_id = _new_job(store, JobState.PENDING)
    with store.session() as b:
        # Held so that B's identity map keeps the stale row (it is weakly referenced).
        seen = b.get(OfflineJob, job_id)
        assert seen is not None and seen.state == JobState.PENDING.value
        with store.session() as a:
            transition(a, job_id, JobState.RUNNING, "a")
        with pytest.raises(ConcurrentTransition):
            transition(b, job_id, JobState.RUNNING, "b")
    assert _snapshot(store, job_id) == (JobState.RUNNING.value, 1)


@pytest.mark.postgres
def test_two_connections_race_and_exactly_one_wins(postgres_store_url: str) -> None:
    # Two real connections, both past their read of PENDING before either
    # writes: whichever UPDATE comes second blocks on the row lock, then
    # re-checks its WHERE against the committed RUNNING row and matches nothing.
    store = Store(postgres_store_url)
    try:
        job_id = _new_job(store, JobState.PENDING)
        both_read = threading.Barrier(2, timeout=30)
        outcomes: dict[str, str] = {}

        def worker(name: str) -> None:
            try:
                with store.session() as s:
                    job = s.get(OfflineJob, job_id)
                    assert job is not None and job.state == JobState.PENDING.value
                    both_read.wait()
                    transition(s, job_id, JobState.RUNNING, name)
                outcomes[name] = "won"
            except ConcurrentTransition:
                outcomes[name] = "lost"
            except BaseException as exc:  # surfaced by the assertion below
                outcomes[name] = repr(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(outcomes.values()) == ["lost", "won"], outcomes
        winner = next(n for n, o in outcomes.items() if o == "won")
        with store.session() as s:
            job = s.get(OfflineJob, job_id)
            assert job is not None and (job.state, job.state_reason) == ("RUNNING", winner)
            audits = s.scalars(select(JobTransition).where(JobTransition.job_id == job_id)).all()
            assert [(a.from_state, a.to_state, a.reason) for a in audits] == [
                ("PENDING", "RUNNING", winner)
            ]
    finally:
        store.dispose()


def test_concurrent_transition_is_an_illegal_transition() -> None:
    assert issubclass(ConcurrentTransition, IllegalTransition)
