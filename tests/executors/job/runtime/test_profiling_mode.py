"""Iteration timer and profiling mode of the runtime helper, against a fake clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from executors.job.runtime import IterationTimer, ProfilingConfigError, ProfilingMode, Runtime, summarize
from executors.job.runtime.profiling import STDOUT_MARKER
from executors.job.runtime.timing import percentile

REPO = Path(__file__).resolve().parents[4]


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def test_percentile_matches_numpy_linear_interpolation() -> None:
    import numpy as np

    xs = [0.3, 0.1, 0.9, 0.5, 0.7, 0.2]
    for q in (0, 5, 50, 90, 95, 100):
        assert percentile(sorted(xs), q) == pytest.approx(float(np.percentile(xs, q)))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_leaves_out_warmup_unless_nothing_would_remain() -> None:
    st = summarize([5.0, 1.0, 2.0, 3.0, 4.0], warmup=1)
    assert (st.count, st.warmup, st.mean_s, st.p50_s, st.min_s, st.max_s) == (4, 1, 2.5, 2.5, 1.0, 4.0)
    assert st.p95_s == pytest.approx(3.85)
    short = summarize([7.0, 9.0], warmup=2)
    assert (short.count, short.warmup, short.mean_s) == (2, 0, 8.0)
    assert summarize([], warmup=1).count == 0


def test_timer_context_manager_and_marks_with_a_fake_clock() -> None:
    clock = FakeClock()
    timer = IterationTimer(clock)
    clock.advance(0.5)                     # setup before the first iteration
    with timer.iteration():
        clock.advance(0.25)
    clock.advance(0.1)                     # between iterations: not part of a timed block
    assert timer.mark() is None            # the block was the iteration: nothing more recorded
    clock.advance(0.4)
    assert timer.mark() == pytest.approx(0.4)  # callback form: time since the previous mark
    assert timer.durations_s == pytest.approx([0.25, 0.4])
    with pytest.raises(RuntimeError), timer.iteration():
        clock.advance(1.0)
        raise RuntimeError("a failed step is not an iteration")
    assert timer.count == 2
    with pytest.raises(ValueError):
        timer.record(-1.0)


def test_timer_keeps_a_bounded_window() -> None:
    timer = IterationTimer(FakeClock(), keep=3)
    for d in (1.0, 2.0, 3.0, 4.0):
        timer.record(d)
    assert timer.count == 4 and timer.durations_s == [2.0, 3.0, 4.0]


@pytest.mark.parametrize("env,message", [
    ({"MUXFLOW_PROFILE_ITERS": "zero"}, "MUXFLOW_PROFILE_ITERS: not an integer"),
    ({"MUXFLOW_PROFILE_ITERS": "0"}, "MUXFLOW_PROFILE_ITERS: must be >= 1"),
    ({"MUXFLOW_PROFILE_SECONDS": "-3"}, "MUXFLOW_PROFILE_SECONDS: must be a positive"),
    ({"MUXFLOW_PROFILE_SECONDS": "nan"}, "MUXFLOW_PROFILE_SECONDS: must be a positive"),
    ({"MUXFLOW_PROFILE_ITERS": "5", "MUXFLOW_PROFILE_WARMUP": "-1"}, "MUXFLOW_PROFILE_WARMUP: must be >= 0"),
])
def test_bad_profiling_settings_name_the_variable(env, message) -> None:
    with pytest.raises(ProfilingConfigError, match=message):
        ProfilingMode.from_env(env)


def test_profiling_mode_round_trips_through_the_environment(tmp_path) -> None:
    assert ProfilingMode.from_env({}) is None
    mode = ProfilingMode(max_iterations=7, max_seconds=30.0, warmup_iterations=1, report_path=tmp_path / "r.json")
    assert ProfilingMode.from_env(mode.to_env()) == mode


def _runtime(tmp_path, mode, clock, wall=None):
    exits: list[int] = []
    rt = Runtime(tmp_path / "ckpt", every_steps=1, exit=exits.append, profiling=mode, clock=clock,
                 wall=wall or clock, signals=())
    return rt, exits


def test_stops_after_n_measured_iterations_with_mean_p50_p95(tmp_path) -> None:
    clock = FakeClock()
    report = tmp_path / "report.json"
    rt, exits = _runtime(tmp_path, ProfilingMode(max_iterations=4, warmup_iterations=1, report_path=report), clock)
    assert rt.profiling and rt.resume() == (0, None)
    durations = [2.0, 0.1, 0.2, 0.3, 0.4]  # the first (warm-up) iteration includes setup
    for step, d in enumerate(durations, start=1):
        clock.advance(d)
        rt.step_done(step, lambda: pytest.fail("profiling mode never checkpoints"))
    assert exits == [0]
    rep = json.loads(report.read_text())
    assert rep["final"] and rep["stopped_by"] == "iterations"
    assert (rep["iterations"], rep["warmup_iterations"], rep["total_iterations"]) == (4, 1, 5)
    assert rep["mean_s"] == pytest.approx(0.25) and rep["p50_s"] == pytest.approx(0.25)
    assert rep["p95_s"] == pytest.approx(0.385) and rep["first_iteration_s"] == pytest.approx(2.0)
    # the measured window starts where the first measured iteration started
    assert rep["window_start_unix"] == pytest.approx(102.0) and rep["window_end_unix"] == pytest.approx(103.0)
    assert not (tmp_path / "ckpt").exists()  # a dry run leaves no checkpoint
    rt.step_done(6, dict)  # after the (fake) exit nothing more happens
    assert exits == [0]


def test_stops_after_t_seconds(tmp_path) -> None:
    clock = FakeClock()
    rt, exits = _runtime(tmp_path, ProfilingMode(max_seconds=1.0, warmup_iterations=0,
                                                 report_path=tmp_path / "r.json"), clock)
    steps = 0
    while not exits:
        steps += 1
        with rt.iteration():
            clock.advance(0.3)
        rt.step_done(steps, dict)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert steps == 4 and rep["stopped_by"] == "seconds" and rep["iterations"] == 4
    assert rep["elapsed_s"] == pytest.approx(1.2)


def test_a_checkpoint_signal_ends_profiling_with_what_was_measured(tmp_path) -> None:
    clock = FakeClock()
    rt, exits = _runtime(tmp_path, ProfilingMode(max_iterations=100, warmup_iterations=0,
                                                 report_path=tmp_path / "r.json"), clock)
    clock.advance(0.5)
    rt.step_done(1, dict)
    rt.stop_requested = signal.SIGTERM
    clock.advance(0.5)
    rt.step_done(2, dict)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert exits == [0] and rep["stopped_by"] == "signal" and rep["iterations"] == 2


def test_progress_reports_are_not_final_and_rate_limited(tmp_path) -> None:
    clock = FakeClock()
    report = tmp_path / "r.json"
    rt, exits = _runtime(tmp_path, ProfilingMode(max_iterations=1000, warmup_iterations=0, report_path=report,
                                                 progress_interval_s=1.0), clock)
    clock.advance(0.2)
    rt.step_done(1, dict)
    first = json.loads(report.read_text())
    assert first["final"] is False and first["iterations"] == 1
    clock.advance(0.2)
    rt.step_done(2, dict)
    assert json.loads(report.read_text())["iterations"] == 1  # within the interval: not rewritten
    clock.advance(1.0)
    rt.step_done(3, dict)
    assert json.loads(report.read_text())["iterations"] == 3
    rep = rt.finish_profile()  # the job ran out of steps before a limit
    assert rep is not None and rep["stopped_by"] == "finished" and rep["final"]
    assert rt.finish_profile() is None and not exits


def test_outside_profiling_mode_checkpoints_and_timing_are_unchanged(tmp_path) -> None:
    clock = FakeClock()
    rt, exits = _runtime(tmp_path, None, clock)
    assert not rt.profiling
    clock.advance(0.5)
    rt.step_done(1, lambda: {"s": 1})
    assert rt.store.latest() == (1, {"s": 1}) and rt.timer.durations_s == [0.5]


def test_example_job_profiled_through_the_environment_exits_cleanly(tmp_path) -> None:
    """The existing example job, unchanged, honours profiling mode from the environment."""
    report = tmp_path / "iter.json"
    env = {**os.environ, "MUXFLOW_PROFILE_ITERS": "5", "MUXFLOW_PROFILE_WARMUP": "1",
           "MUXFLOW_PROFILE_REPORT": str(report)}
    out = subprocess.run([sys.executable, "-m", "executors.job.runtime.example_train", "--ckpt", str(tmp_path / "c"),
                          "--out", str(tmp_path / "o.json"), "--steps", "1000"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert rep["iterations"] == 5 and rep["total_iterations"] == 6 and rep["stopped_by"] == "iterations"
    assert rep["mean_s"] > 0 and rep["p95_s"] >= rep["p50_s"] > 0
    assert STDOUT_MARKER in out.stdout
    assert not (tmp_path / "o.json").exists() and not list((tmp_path / "c").glob("ckpt-*"))
