"""The solo profiler's bookkeeping against a fake Slurm and a fake clock (SQLite and Postgres):
reuse, the bound, the queue limit, restarts that neither lose nor duplicate a run."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from executors.scheduler.profiling.settings import ProfilingSettings
from executors.scheduler.profiling.solo import ProfilingSummary, SoloProfiler
from executors.store import models as m
from executors.store.jobs import transition
from scheduler_core.domain import JobState
from scheduler_core.jobs.sync import ClusterView, Seen
from tests.executors.scheduler.profiling.helpers import (
    GOOD_PROBE,
    FakeClock,
    FakeSlurm,
    add_gpu_types,
    add_job,
    job_state,
    runs_of,
    set_slurm_id,
)


@pytest.fixture
def env(store, tmp_path):
    add_gpu_types(store, "t4", "a10")
    clock = FakeClock()
    ex = FakeSlurm(clock)
    settings = ProfilingSettings(bound_s=100, profile_seconds=50, max_queue_s=300, wait_s=0,
                                 profile_dir=str(tmp_path / "runs"))
    return store, ex, clock, settings


def profiler(env, **over):
    store, ex, clock, settings = env
    from dataclasses import replace

    return SoloProfiler(store, ex, replace(settings, **over), now=clock, sleep=lambda s: None)


def test_a_job_is_profiled_on_each_allowed_gpu_type_and_stored_with_its_measurements(env) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "two-types", "python train.py", gpu_types=("t4", "a10"))
    p = profiler(env)
    s = p.run()
    assert s.submitted == 2 and s.in_progress == [job] and job_state(store, job)[0] == "PROFILING"
    script = ex.jobs[ex.handle_of(job, "t4")].spec.script
    assert "executors.node.profiling.probe" in script and "--gpu-type t4" in script and "--deadline 90.0" in script
    assert (ex.jobs[ex.handle_of(job, "t4")].spec.run_dir / "job.sh").read_text() == "#!/bin/sh\npython train.py\n"
    for g in ("t4", "a10"):
        ex.start(ex.handle_of(job, g))
        ex.finish(ex.handle_of(job, g), GOOD_PROBE)
    s = p.run()
    assert s.profiled == [job] and job_state(store, job)[0] == "PENDING"
    with store.session() as ses:
        prof = {r.gpu_type: (r.method, r.source, r.iter_time_s, r.measured_iter_time_s, r.iterations, r.slurm_job_id)
                for r in ses.scalars(select(m.JobProfile).where(m.JobProfile.job_id == job))}
    assert prof["t4"] == ("simulated-metrics", "simulated", 0.21, 0.05, 20, ex.handle_of(job, "t4"))
    assert [r.state for r in runs_of(store, job)] == ["done", "done"]


def test_one_failed_gpu_type_fails_the_job_and_cancels_the_other_run(env) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "crashy", "python crash.py", gpu_types=("t4", "a10"))
    p = profiler(env)
    p.run()
    ex.finish(ex.handle_of(job, "a10"), {**GOOD_PROBE, "exit_code": 1, "iteration_report": None,
                                         "stderr_tail": "RuntimeError: CUDA error\n"})
    s = p.run()
    state, reason = job_state(store, job)
    assert state == "FAILED" and reason.startswith("profiling failed on a10: crashed (exit code 1)")
    assert "RuntimeError: CUDA error" in reason and s.failed == {job: reason}
    assert ex.jobs[ex.handle_of(job, "t4")].cancelled
    assert {r.gpu_type: r.state for r in runs_of(store, job)} == {"a10": "failed", "t4": "failed"}


def test_reuse_takes_the_profile_of_the_same_job_type_instead_of_a_run(env) -> None:
    store, ex, clock, _ = env
    first = add_job(store, "first", "python a.py")
    p = profiler(env, reuse_profiles=True)
    p.run()
    ex.finish(ex.handle_of(first, "t4"), GOOD_PROBE)
    p.run()
    second = add_job(store, "second", "python b.py")
    other = add_job(store, "other-type", "python c.py", job_type="Transformer (batch size 32)")
    s = p.run()
    assert s.reused == [second] and job_state(store, second)[0] == "PENDING"
    assert len(ex.jobs) == 2  # first's run, and a run for the other job type; none for the reused one
    with store.session() as ses:
        r = ses.scalars(select(m.JobProfile).where(m.JobProfile.job_id == second)).one()
        assert (r.method, r.reused_from_job_id, r.iter_time_s, r.measured_iter_time_s) == ("reused", first, 0.21, 0.05)
    assert job_state(store, other)[0] == "PROFILING"
    no_reuse = add_job(store, "third", "python d.py")
    profiler(env, reuse_profiles=False).run()
    assert job_state(store, no_reuse)[0] == "PROFILING" and len(ex.jobs) == 3


def test_a_run_that_never_starts_or_never_ends_fails_with_the_reason(env) -> None:
    store, ex, clock, _ = env
    queued = add_job(store, "queued", "python q.py")
    hung = add_job(store, "hung", "python h.py")
    p = profiler(env)
    p.run()
    ex.start(ex.handle_of(hung, "t4"))
    clock.advance(131)  # past bound (100) + 30 s of grace for the running one
    p.run()
    assert job_state(store, hung) == ("FAILED", "profiling failed on t4: exceeded the profiling bound of 100 s "
                                                "(cancelled)")
    assert ex.jobs[ex.handle_of(hung, "t4")].cancelled and job_state(store, queued)[0] == "PROFILING"
    clock.advance(200)  # 331 s in the queue > max_queue_s 300
    p.run()
    state, reason = job_state(store, queued)
    assert state == "FAILED" and "not started on the profile partition within 300 s" in reason


def test_slurm_down_at_submission_then_back_submits_each_run_exactly_once(env) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "later", "python l.py")
    ex.unavailable = True
    s = profiler(env).run()
    assert s.submitted == 0 and job_state(store, job)[0] == "PROFILING"
    (run,) = runs_of(store, job)
    assert run.state == "submitted" and run.slurm_job_id is None
    ex.unavailable = False
    # a profiler that crashed right after Slurm took the job, before recording the id: the key finds it
    ex.submit(profiler(env)._spec(run, "ResNet-18 (batch size 16)", "#!/bin/sh\ntrue\n", None))
    s = profiler(env).run()  # a fresh process (looks for the run at once; would send it only after the grace)
    assert s.submitted == 0 and len(ex.jobs) == 1
    assert runs_of(store, job)[0].slurm_job_id == next(iter(ex.jobs))
    ex.finish(next(iter(ex.jobs)), GOOD_PROBE)
    assert profiler(env).run().profiled == [job]


def test_a_job_left_profiling_without_runs_gets_them(env) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "orphan", "python o.py", gpu_types=("t4", "a10"))
    from executors.store.jobs import transition
    from scheduler_core.domain import JobState

    with store.session() as s:  # a profiler that stopped between the transition and its runs
        transition(s, job, JobState.PROFILING, "test", at_utc=clock())
    summary = ProfilingSummary()
    clock.advance(SoloProfiler.TAKEOVER_GRACE_S - 1)  # it may still be starting them: not taken over yet
    profiler(env).start_new(summary)
    assert summary.submitted == 0 and runs_of(store, job) == []
    clock.advance(1)
    profiler(env).start_new(summary)
    assert summary.submitted == 2 and sorted(r.gpu_type for r in runs_of(store, job)) == ["a10", "t4"]
    profiler(env).start_new(summary)  # open runs are not duplicated
    assert len(runs_of(store, job)) == 2


def test_overlapping_profilers_never_send_one_run_twice(env) -> None:
    """Profiler A has stored a run and is in its sbatch; profiler B, polling every open run, sees the row without a
    Slurm id. B only looks for it (by its key) until the grace is over; A's own retry after Slurm was down is
    immediate."""
    store, ex, clock, _ = env
    job = add_job(store, "busy", "python b.py")
    a, b = profiler(env), profiler(env)
    ex.unavailable = True  # A's sbatch does not come back yet: its row has no Slurm id
    a.start_new(ProfilingSummary())
    (run,) = runs_of(store, job)
    ex.unavailable = False
    summary = ProfilingSummary()
    assert b.poll_once(summary) == 1 and summary.submitted == 0 and ex.jobs == {}  # B: not its run, too young
    a.poll_once(summary)  # A sends its own run again at once
    assert summary.submitted == 1 and len(ex.jobs) == 1
    b.poll_once(summary)  # B now finds A's job by its key and records it; nothing sent
    assert summary.submitted == 1 and runs_of(store, job)[0].slurm_job_id == next(iter(ex.jobs))
    # A run left behind by a profiler that stopped before its sbatch: taken over after the grace
    job2 = add_job(store, "orphan-run", "python o.py")
    ex.unavailable = True
    profiler(env).start_new(ProfilingSummary())
    ex.unavailable = False
    (run2,) = runs_of(store, job2)
    b.poll_once(summary)
    assert runs_of(store, job2)[0].slurm_job_id is None
    clock.advance(SoloProfiler.TAKEOVER_GRACE_S)
    b.poll_once(summary)
    assert summary.submitted == 2 and runs_of(store, job2)[0].slurm_job_id is not None


def test_a_job_whose_script_cannot_be_read_fails_with_that_reason(env) -> None:
    store, ex, clock, _ = env
    from executors.scheduler.profiling.runs import ExecutorError

    def no_script(sid, command):
        raise ExecutorError("cannot read the batch script of Slurm job 77: Invalid job id specified")

    ex.job_script = no_script
    job = add_job(store, "gone", "sbatch job 77")
    profiler(env).run()
    assert job_state(store, job) == ("FAILED", "profiling failed: cannot read the batch script of Slurm job 77: "
                                               "Invalid job id specified")


def test_a_job_cancelled_in_slurm_before_its_profiling_gets_no_run(env) -> None:
    store, ex, clock, _ = env
    kept, cancelled, purged = (add_job(store, n, "python t.py") for n in ("kept", "cancelled", "purged"))
    for job, sid in ((kept, 41), (cancelled, 42), (purged, 43)):
        set_slurm_id(store, job, sid)
    ex.user_jobs[42] = ClusterView(Seen.CANCELLED, "CANCELLED")
    ex.user_jobs[43] = ClusterView(Seen.ABSENT)
    s = profiler(env).run()
    assert s.submitted == 1 and [j.spec.name for j in ex.jobs.values()] == [f"mxprof-j{kept}-t4"]
    assert job_state(store, cancelled) == ("FAILED", "cancelled in the cluster before it was placed (CANCELLED)")
    assert job_state(store, purged) == ("FAILED", "no longer known to the cluster before it was placed (absent)")
    assert set(s.failed) == {cancelled, purged} and runs_of(store, cancelled) == []
    assert job_state(store, kept)[0] == "PROFILING"


def test_a_job_cancelled_while_profiled_has_its_runs_cancelled(env) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "two", "python t.py", gpu_types=("t4", "a10"))
    set_slurm_id(store, job, 77)
    mono = [0.0]
    p = SoloProfiler(store, ex, env[3], now=clock, sleep=lambda s: None, monotonic=lambda: mono[0])
    p.run()
    ex.start(ex.handle_of(job, "t4"))
    ex.user_jobs[77] = ClusterView(Seen.CANCELLED, "CANCELLED")
    assert p.poll_once(ProfilingSummary()) == 2  # Slurm is asked at most every USER_JOB_CHECK_S
    mono[0] += p.USER_JOB_CHECK_S
    assert p.poll_once(ProfilingSummary()) == 0
    assert job_state(store, job) == ("FAILED", "cancelled in the cluster before it was placed (CANCELLED)")
    assert all(ex.jobs[ex.handle_of(job, g)].cancelled for g in ("t4", "a10"))
    assert {r.state for r in runs_of(store, job)} == {"failed"}
    assert all("cancelled: the job cancelled in the cluster" in r.reason for r in runs_of(store, job))


def test_a_job_the_job_state_sync_failed_meanwhile_has_its_runs_cancelled(env) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "synced", "python t.py")
    p = profiler(env)
    p.run()
    with store.session() as ses:  # the job-state sync, in another process, saw the user's scancel
        transition(ses, job, JobState.FAILED, "cancelled in the cluster before it was placed (CANCELLED)")
    assert p.poll_once(ProfilingSummary()) == 0
    assert ex.jobs[ex.handle_of(job, "t4")].cancelled
    (run,) = runs_of(store, job)
    assert run.state == "failed" and run.reason == ("cancelled: the job ended before it was profiled: cancelled in "
                                                    "the cluster before it was placed (CANCELLED)")
    assert job_state(store, job)[0] == "FAILED"


def test_slurm_unreachable_when_checking_the_jobs_leaves_them_as_they_are(env) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "waits", "python t.py")
    set_slurm_id(store, job, 88)
    ex.user_jobs[88] = ClusterView(Seen.CANCELLED, "CANCELLED")
    ex.unavailable = True
    s = profiler(env).run()
    assert s.failed == {} and job_state(store, job)[0] == "PROFILING" and s.submitted == 0


def test_the_job_state_sync_failing_a_job_as_its_profile_lands_wins_without_an_error(env, monkeypatch) -> None:
    store, ex, clock, _ = env
    job = add_job(store, "race", "python t.py")
    p = profiler(env)
    p.run()
    from executors.scheduler.profiling import solo

    real = solo.transition

    def sync_first(s, job_id, target, *args, **kwargs):
        if target == JobState.PENDING:  # the sync, in another process, commits FAILED just before
            with store.session() as other:
                real(other, job_id, JobState.FAILED, "cancelled in the cluster before it was placed (CANCELLED)")
        return real(s, job_id, target, *args, **kwargs)

    monkeypatch.setattr(solo, "transition", sync_first)
    ex.start(ex.handle_of(job, "t4"))
    ex.finish(ex.handle_of(job, "t4"), GOOD_PROBE)
    s = ProfilingSummary()
    assert p.poll_once(s) == 0 and s.profiled == []
    assert job_state(store, job) == ("FAILED", "cancelled in the cluster before it was placed (CANCELLED)")
    assert [r.state for r in runs_of(store, job)] == ["done"]
