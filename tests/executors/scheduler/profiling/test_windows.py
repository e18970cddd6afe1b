"""Profiling in place (executors.scheduler.profiling.windows) against a stateful fake slurmrestd: a user's own job runs its
profiling windows on the profile partition, one GPU type at a time; MuxFlow never submits anything for it."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from executors.scheduler.profiling.outcome import classify_window
from executors.scheduler.profiling.settings import ProfilingSettings
from executors.scheduler.profiling.solo import ProfilingSummary
from executors.scheduler.profiling.windows import SlurmProfileWindows, WindowProfiler, free_gpus
from executors.scheduler.slurm.pickup import import_submissions
from executors.slurm import plan as plans
from executors.store import models as m
from executors.store.db import Store
from executors.store.profiling import record_window_report
from tests.executors.scheduler.slurm.fake_slurm import PLAN_KEY, FakeSlurm, make_job, store_with_fake_nodes

SPEC = "muxflow: mem=2GiB gpu-types={types} ckpt=/ckpt/{n} steps=100"
T0 = dt.datetime(2026, 11, 27, 12, tzinfo=dt.UTC)
SETTINGS = ProfilingSettings(iterations=5, profile_seconds=60.0, bound_s=120.0, max_queue_s=300.0)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> dt.datetime:
        return self.t

    def advance(self, s: float) -> None:
        self.t += dt.timedelta(seconds=s)


@pytest.fixture()
def fake() -> FakeSlurm:
    return FakeSlurm([make_job(11, comment=SPEC.format(types="t4,a10", n="a")),
                      make_job(12, comment=SPEC.format(types="t4", n="b"))])


@pytest.fixture()
def store(tmp_path: Path, fake: FakeSlurm) -> Store:
    store = store_with_fake_nodes(tmp_path, fake)
    import_submissions(store, fake, None)
    return store


def _profiler(store: Store, fake: FakeSlurm, clock: Clock) -> WindowProfiler:
    windows = SlurmProfileWindows(fake, PLAN_KEY, retry_deadline_s=0.5)
    return WindowProfiler(store, windows, SETTINGS, now=clock, sleep=lambda s: clock.advance(s))


def _job(store: Store, sid: int) -> m.OfflineJob:
    with store.session() as s:
        return s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id == sid)).one()


def _open_run(store: Store, sid: int) -> m.ProfilingRun | None:
    with store.session() as s:
        job = s.scalars(select(m.OfflineJob).where(m.OfflineJob.slurm_job_id == sid)).one()
        return s.scalars(select(m.ProfilingRun).where(m.ProfilingRun.job_id == job.id,
                                                      m.ProfilingRun.state.in_(("submitted", "running")))).first()


def _start(fake: FakeSlurm, sid: int, clock: Clock) -> None:
    """Slurm starts the released job on the node it is pinned to."""
    j = fake.jobs[sid]
    assert not j.held and j.partition == "profile"
    fake.jobs[sid] = replace(j, state="RUNNING", nodes=j.required_nodes, start_time_utc=clock())


def _agent_report(store: Store, run: m.ProfilingRun, iterations: int, *, mean_s: float = 0.05,
                  **extra: object) -> None:
    """What the node agent writes into the run's row while the window runs (``extra``: more report fields)."""
    rep = {"format": "muxflow-window-report/1", "host": run.node, "gpu_index": run.gpu_index, "elapsed_s": 3.0,
           "final": False, "metrics_source": "simulated", "model_iter_time_s": 0.1, "device": "cpu",
           "iteration_report": {"iterations": iterations, "total_iterations": iterations + 2, "mean_s": mean_s,
                                "p50_s": mean_s, "p95_s": mean_s, "final": False},
           "metrics": {"source": "simulated", "samples": 40, "gpu_util_pct": 80.0, "sm_activity_pct": 60.0,
                       "sm_occupancy_pct": 30.0, "mem_used_bytes": 2e9, "mem_total_bytes": 16e9,
                       "mem_bw_util_pct": 40.0, "sm_clock_mhz": 1500.0, "sm_clock_max_mhz": 1590.0, "notes": ""},
           **extra}
    with store.session() as s:
        assert record_window_report(s, run.id, run.slurm_job_id, run.node, run.gpu_index, T0, rep)


def test_free_gpus_follow_slurms_accounting_and_open_windows() -> None:
    fake = FakeSlurm(untyped=("mx-a10-1",))
    fake.gres_used = {"mx-t4-1": "mps:t4g0:30(IDX:0),mps:t4g2:100(IDX:2)", "mx-a10-1": "mps:150"}
    nodes = fake.list_nodes()
    assert [(p.node, p.gpu_index) for p in free_gpus(nodes, "profile", "t4", {("mx-t4-1", 1)})] == [("mx-t4-1", 3)]
    # an untyped node: 150 % in use takes at least two GPUs, the lowest indices
    assert [p.gpu_index for p in free_gpus(nodes, "profile", "a10", set())] == [2, 3]
    assert free_gpus(nodes, "online", "t4", set()) == [] and free_gpus(nodes, "profile", "h100", set()) == []


def test_a_job_is_profiled_in_its_own_slurm_job_one_type_at_a_time(store: Store, fake: FakeSlurm) -> None:
    clock = Clock()
    prof = _profiler(store, fake, clock)
    summary = ProfilingSummary()
    prof.start_new(summary)
    assert fake.sent("submit") == []  # nothing is ever submitted for a user: the job itself is profiled
    j = fake.jobs[11]
    window = plans.decode(j.comment, PLAN_KEY, 11)
    run = _open_run(store, 11)
    assert window.kind == "profile" and window.run_id == run.id and window.job_id == _job(store, 11).id
    assert (j.partition, j.held, j.gres_per_node, j.required_nodes) == ("profile", False, "gres:mps:100",
                                                                         (run.node,))
    first_type, second_type = _job(store, 11).allowed_gpu_types  # one window per type, in this order
    node_of = {"t4": "mx-t4-1", "a10": "mx-a10-1"}
    assert run.gpu_type == first_type and (run.node, run.gpu_index) == (node_of[first_type], window.gpu_index)
    # the other job's window (T4) takes another GPU than the first's
    run12 = _open_run(store, 12)
    assert run12.node == "mx-t4-1" and (run12.node, run12.gpu_index) != (run.node, run.gpu_index)
    assert _job(store, 11).state == "PROFILING"

    _start(fake, 11, clock)
    prof.poll_once(summary)
    assert fake.sent("requeue") == []  # nothing measured yet: the window stays open
    _agent_report(store, _open_run(store, 11), iterations=5)
    prof.poll_once(summary)
    assert fake.sent("requeue") == [("requeue", 11, True)]  # enough iterations: closed by a requeue-hold
    prof.poll_once(summary)  # held again: the profile kept, and the next window opened
    offline = [u for (_, sid, u) in fake.sent("update_job") if sid == 11 and u.partition == "offline"]
    assert len(offline) == 1 and offline[0].comment == ""  # it went back, the window's plan cleared
    with store.session() as s:
        first = s.get(m.ProfilingRun, run.id)
        prof_t4 = s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == first.job_id)).all()
        assert first.state == "done" and [p.gpu_type for p in prof_t4] == [first_type]
    # the next window, on the other type, opened at once
    run2 = _open_run(store, 11)
    assert run2.gpu_type == second_type and run2.node == node_of[second_type]
    assert plans.decode(fake.jobs[11].comment, PLAN_KEY, 11).run_id == run2.id
    _start(fake, 11, clock)
    _agent_report(store, _open_run(store, 11), iterations=7)
    prof.poll_once(summary)
    prof.poll_once(summary)
    assert _job(store, 11).state == "PENDING" and _job(store, 11).id in summary.profiled
    j = fake.jobs[11]
    assert j.held and j.partition == "offline" and j.comment == ""  # back, held, waiting for a round


def test_a_job_that_ends_in_its_window_is_done_or_failed_as_slurm_says(store: Store, fake: FakeSlurm) -> None:
    clock = Clock()
    prof = _profiler(store, fake, clock)
    summary = ProfilingSummary()
    prof.start_new(summary)
    _start(fake, 11, clock)
    _start(fake, 12, clock)
    _agent_report(store, _open_run(store, 11), iterations=3)
    fake.jobs[11] = replace(fake.jobs[11], state="COMPLETED", exit_code=0, end_time_utc=clock())
    fake.jobs[12] = replace(fake.jobs[12], state="FAILED", exit_code=3, end_time_utc=clock())
    prof.poll_once(summary)
    done, failed = _job(store, 11), _job(store, 12)
    assert done.state == "DONE" and "during its profiling window" in done.state_reason
    assert failed.state == "FAILED" and "exit code 3" in failed.state_reason
    assert fake.sent("requeue") == []  # an ended job is not requeued
    with store.session() as s:
        assert s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == done.id)).one().gpu_type in ("t4", "a10")


def test_a_window_without_the_node_agents_report_fails_with_the_reason(store: Store, fake: FakeSlurm) -> None:
    clock = Clock()
    prof = _profiler(store, fake, clock)
    summary = ProfilingSummary()
    prof.start_new(summary)
    _start(fake, 12, clock)
    clock.advance(SETTINGS.profile_seconds + 1)
    prof.poll_once(summary)  # the window's seconds are over: closed
    prof.poll_once(summary)
    j = _job(store, 12)
    assert j.state == "FAILED" and "node agent on mx-t4-1" in j.state_reason
    assert fake.jobs[12].held and fake.jobs[12].partition == "offline"  # the user's job is never cancelled


def test_a_window_waits_for_a_free_gpu_then_gives_up(tmp_path: Path) -> None:
    fake = FakeSlurm([make_job(11, comment=SPEC.format(types="t4", n="a"))], nodes={"mx-t4-1": ("t4", 1)})
    fake.gres_used = {"mx-t4-1": "mps:t4g0:40"}
    store = store_with_fake_nodes(tmp_path, fake)
    import_submissions(store, fake, None)
    clock = Clock()
    prof = _profiler(store, fake, clock)
    summary = ProfilingSummary()
    prof.start_new(summary)
    assert fake.jobs[11].held and _open_run(store, 11).gpu_index is None  # no free GPU: the run waits
    fake.gres_used = {}
    prof.poll_once(summary)
    assert not fake.jobs[11].held and _open_run(store, 11).gpu_index == 0
    prof.windows.close(11, _open_run(store, 11).id)  # (back, to check the give-up path with a busy GPU again)
    fake.gres_used = {"mx-t4-1": "mps:t4g0:40"}
    with store.session() as s:
        run = s.get(m.ProfilingRun, _open_run(store, 11).id)
        run.gpu_index, run.node = None, None
    clock.advance(SETTINGS.max_queue_s + 1)
    prof.poll_once(summary)
    assert _job(store, 11).state == "FAILED" and "no GPU of its type free" in _job(store, 11).state_reason


def test_a_restarted_profiler_opens_nothing_twice(store: Store, fake: FakeSlurm) -> None:
    clock = Clock()
    _profiler(store, fake, clock).start_new(ProfilingSummary())
    fake.calls.clear()
    again = _profiler(store, fake, clock)
    again.start_new(ProfilingSummary())
    again.poll_once(ProfilingSummary())
    assert fake.sent("update_job") == []  # both windows are open already: nothing sent


def test_a_window_outcome() -> None:
    assert not classify_window(None, slurm_state="HELD", exit_code=None, node="n1", started=False).ok
    out = classify_window({"iteration_report": {"iterations": 0}, "elapsed_s": 60}, slurm_state="HELD",
                          exit_code=None, node="n1", started=True)
    assert out.reason == "no GPU metrics for the window: none taken"
    out = classify_window({"report_error": "iteration.json is not the job user's"}, slurm_state="HELD",
                          exit_code=None, node="n1", started=True)
    assert "refused" in out.reason
    out = classify_window(None, slurm_state="OUT_OF_MEMORY", exit_code=137, node="n1", started=True)
    assert "OUT_OF_MEMORY, exit code 137" in out.reason


def _one_job(tmp_path: Path, comment: str) -> tuple[Store, FakeSlurm, Clock, WindowProfiler]:
    """Slurm job 21 with ``comment``, picked up, its first window opened."""
    fake = FakeSlurm([make_job(21, comment=comment)])
    store = store_with_fake_nodes(tmp_path, fake)
    import_submissions(store, fake, None)
    clock = Clock()
    prof = _profiler(store, fake, clock)
    prof.start_new(ProfilingSummary())
    return store, fake, clock, prof


def _window_to_end(store: Store, fake: FakeSlurm, prof: WindowProfiler, clock: Clock, sid: int, **report) -> None:
    """Start the open window of ``sid``, report into it, and let the profiler close it and take it in."""
    _start(fake, sid, clock)
    _agent_report(store, _open_run(store, sid), **report)
    prof.poll_once(ProfilingSummary())
    prof.poll_once(ProfilingSummary())


@pytest.mark.parametrize(("windows", "expected"), [
    ([["SIGUSR1"], []], "detected"),            # seen once is enough: a handler installed late still counts
    ([[], ["SIGTERM"]], "detected"),
    ([[], []], "undetected"),
])
def test_a_plain_job_is_seen_to_checkpoint_or_not(tmp_path: Path, windows: list, expected: str) -> None:
    store, fake, clock, prof = _one_job(tmp_path, "")  # a plain sbatch: no comment at all
    assert _job(store, 21).checkpointing is None
    for caught in windows[: len(_job(store, 21).allowed_gpu_types)]:
        _window_to_end(store, fake, prof, clock, 21, iterations=6, checkpoint_signals=caught)
    job = _job(store, 21)
    assert job.state == "PENDING" and job.checkpointing == expected


def test_a_handler_the_batch_shell_would_not_outlive_does_not_count(tmp_path: Path) -> None:
    # Slurm's signals reach the batch shell too: one that neither traps nor ignores them dies before the program saves.
    store, fake, clock, prof = _one_job(tmp_path, "muxflow: gpu-types=t4")
    _window_to_end(store, fake, prof, clock, 21, iterations=6, checkpoint_signals=["SIGUSR1"], shell_dies_first=True)
    assert _job(store, 21).checkpointing == "undetected"


@pytest.mark.parametrize(("comment", "expected"), [("muxflow: gpu-types=t4 checkpoint=none", "none"),
                                                   ("muxflow: gpu-types=t4 checkpoint=signal", "declared")])
def test_the_comments_word_on_checkpointing_stands(tmp_path: Path, comment: str, expected: str) -> None:
    store, fake, clock, prof = _one_job(tmp_path, comment)
    caught = [] if expected == "declared" else ["SIGUSR1"]
    _window_to_end(store, fake, prof, clock, 21, iterations=6, checkpoint_signals=caught)
    assert _job(store, 21).checkpointing == expected


def test_a_job_without_an_iteration_signal_is_profiled_on_its_gpu_activity(tmp_path: Path) -> None:
    store, fake, clock, prof = _one_job(tmp_path, "muxflow: gpu-types=t4")
    _start(fake, 21, clock)
    _agent_report(store, _open_run(store, 21), iterations=0, elapsed_s=61.0, iteration_report=None, job_cpu_s=58.0)
    prof.poll_once(ProfilingSummary())
    assert fake.sent("requeue") == []  # no iterations: the window runs its whole length
    clock.advance(SETTINGS.profile_seconds)
    prof.poll_once(ProfilingSummary())
    prof.poll_once(ProfilingSummary())
    job = _job(store, 21)
    assert job.state == "PENDING"
    assert job.mem_bytes == 2099 * 2**20  # undeclared: the profiled peak (2e9 B) + 10 %, rounded up to MiB
    with store.session() as s:
        (prof_row,) = s.scalars(select(m.JobProfile).where(m.JobProfile.job_id == job.id)).all()
        assert prof_row.progress_signal == "gpu-activity"
        assert prof_row.iter_time_s == pytest.approx(0.1)  # simulated metrics: the model's iteration time
        assert prof_row.measured_iter_time_s is None and prof_row.iterations == 0


def test_a_job_that_announced_iterations_has_until_near_the_bound_to_start_stepping(tmp_path: Path) -> None:
    """The hook's announcement (an iteration report, no step counted yet): a job still importing or loading is not
    judged by its GPU activity at ``profile_seconds``; it is closed a margin before its bound (here 108 s of 120)."""
    store, fake, clock, prof = _one_job(tmp_path, "muxflow: gpu-types=t4")
    _start(fake, 21, clock)
    run = _open_run(store, 21)
    announced = {"iterations": 0, "total_iterations": 0, "mean_s": None, "final": False, "signal": "optimizer-step"}
    _agent_report(store, run, iterations=0, iteration_report=announced, job_cpu_s=50.0)
    clock.advance(SETTINGS.profile_seconds + 1)
    prof.poll_once(ProfilingSummary())
    assert fake.sent("requeue") == []
    clock.advance(SETTINGS.deadline_s - SETTINGS.profile_seconds - 2)
    prof.poll_once(ProfilingSummary())
    assert fake.sent("requeue") == []  # 107 s
    clock.advance(1.0)
    prof.poll_once(ProfilingSummary())
    assert fake.sent("requeue") == [("requeue", 21, True)]  # 108 s: closed


def test_an_idle_gpu_and_no_iterations_is_no_profile() -> None:
    rep = {"elapsed_s": 60.0, "metrics_source": "measured", "iteration_report": None,
           "metrics": {"gpu_util_pct": 0.4, "sm_activity_pct": 0.1, "sm_occupancy_pct": 0.0, "mem_used_bytes": 5e8,
                       "mem_bw_util_pct": 0.0, "sm_clock_mhz": 1500.0}}
    out = classify_window(rep, slurm_state="HELD", exit_code=None, node="n1", started=True)
    assert not out.ok and "kept its GPU idle" in out.reason
    busy = {**rep, "metrics": {**rep["metrics"], "gpu_util_pct": 90.0}}
    out = classify_window(busy, slurm_state="HELD", exit_code=None, node="n1", started=True)
    assert out.ok and out.features.iter_time_s == 1.0 and out.measured["progress_signal"] == "gpu-activity"


@pytest.mark.parametrize(("cpu_s", "ok"), [(0.02, False), (None, False), (float("nan"), False), (2.9, False),
                                            (3.1, True), (55.0, True)])
def test_on_a_simulated_gpu_a_job_whose_processes_stay_idle_is_no_profile(cpu_s: float | None, ok: bool) -> None:
    """The simulated GPU's busy model stands for a job that works: ``sleep 600`` (no CPU) is not profiled."""
    rep = {"elapsed_s": 60.0, "metrics_source": "simulated", "model_iter_time_s": 0.1, "iteration_report": None,
           "metrics": {"gpu_util_pct": 80.0, "sm_activity_pct": 60.0, "sm_occupancy_pct": 30.0, "mem_used_bytes": 2e9,
                       "mem_bw_util_pct": 40.0, "sm_clock_mhz": 1500.0}}
    if cpu_s is not None:
        rep["job_cpu_s"] = cpu_s
    out = classify_window(rep, slurm_state="HELD", exit_code=None, node="n1", started=True)
    assert out.ok is ok, out.reason
    if not ok:
        assert "reported no iterations in its 60 s profiling window and its processes stayed idle" in out.reason
    else:
        assert out.measured["progress_signal"] == "gpu-activity"


def test_a_profile_records_what_measured_the_progress() -> None:
    rep = {"elapsed_s": 10.0, "metrics_source": "measured",
           "iteration_report": {"iterations": 8, "mean_s": 0.2, "final": True, "signal": "optimizer-step"},
           "metrics": {"gpu_util_pct": 90.0, "sm_activity_pct": 70.0, "sm_occupancy_pct": 30.0, "mem_used_bytes": 1e9,
                       "mem_bw_util_pct": 20.0, "sm_clock_mhz": 1500.0}}
    out = classify_window(rep, slurm_state="HELD", exit_code=None, node="n1", started=True)
    assert out.ok and out.measured["progress_signal"] == "optimizer-step" and out.features.iter_time_s == 0.2
