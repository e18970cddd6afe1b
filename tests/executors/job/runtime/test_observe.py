"""Observing a job in its profiling window: the runtime trains as always and times its iterations into a report."""

from __future__ import annotations

import atexit
import json
import os
import signal
from pathlib import Path

import pytest

from executors.job.runtime import ProfilingConfigError, ProfilingMode, Runtime
from executors.job.runtime.profiling import ENV_ITERATION_REPORT, OBSERVE_KEEP, ProfileSession


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _runtime(tmp_path: Path, monkeypatch, **env: str) -> tuple[Runtime, FakeClock, list[int]]:
    for k in ("MUXFLOW_PROFILE_ITERS", "MUXFLOW_PROFILE_SECONDS", "MUXFLOW_PROFILE_REPORT", ENV_ITERATION_REPORT):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # the observer names itself the report's owner in this process's environment: put it back after the test
    # (sbatch hands a test runner's environment to the jobs of later tests)
    monkeypatch.setenv("MUXFLOW_ITERATION_REPORT_OWNER", "")
    clock, exits = FakeClock(), []
    rt = Runtime(tmp_path / "ckpt", every_steps=3, signals=(), exit=exits.append, clock=clock, wall=clock)
    return rt, clock, exits


def test_an_observed_job_trains_checkpoints_and_never_stops_by_itself(tmp_path: Path, monkeypatch) -> None:
    report = tmp_path / "iteration.json"
    rt, clock, exits = _runtime(tmp_path, monkeypatch, **{ENV_ITERATION_REPORT: str(report)})
    assert not rt.profiling and rt.observer is not None
    step, state = rt.resume()
    assert (step, state) == (0, None)
    for step in range(1, 8):
        clock.t += 0.5
        rt.step_done(step, lambda s=step: {"step": s})
    assert exits == []  # observing is not a dry run: the job goes on
    assert rt.store.latest()[0] == 6  # and checkpoints on its interval as always
    rep = json.loads(report.read_text())
    assert rep["observed"] is True and rep["final"] is False
    assert rep["total_iterations"] >= 1 and rep["mean_s"] == pytest.approx(0.5)
    # the checkpoint signal: the final report, then the checkpoint and the exit (as without observing)
    rt._on_signal(signal.SIGTERM, None)
    clock.t += 0.5
    rt.step_done(8, lambda: {"step": 8})
    final = json.loads(report.read_text())
    assert final["final"] is True and final["stopped_by"] == "signal" and final["total_iterations"] == 8
    assert final["iterations"] == 6 and final["warmup_iterations"] == 2
    assert exits == [0] and rt.store.latest()[0] == 8
    assert os.environ["MUXFLOW_ITERATION_REPORT_OWNER"] == str(report)  # the hook defers for this report only


def test_a_dry_run_asked_for_wins_over_observing(tmp_path: Path, monkeypatch) -> None:
    rt, _, _ = _runtime(tmp_path, monkeypatch, MUXFLOW_PROFILE_ITERS="5",
                        **{ENV_ITERATION_REPORT: str(tmp_path / "r.json")})
    assert rt.profiling and rt.observer is None
    atexit.unregister(rt.finish_profile)  # a dry run never stepped: no final report at pytest's exit


def test_a_report_that_cannot_be_written_never_stops_the_job(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a-file").write_text("")  # the report's directory cannot be made
    rt, clock, exits = _runtime(tmp_path, monkeypatch, **{ENV_ITERATION_REPORT: str(tmp_path / "a-file" / "r.json")})
    for step in range(1, 4):
        clock.t += 1.0
        rt.step_done(step, lambda s=step: {"step": s})
    assert rt.observer is None and exits == [] and rt.store.latest()[0] == 3


def test_observing_needs_a_report_and_no_limits() -> None:
    with pytest.raises(ProfilingConfigError):
        ProfilingMode(observe=True)
    with pytest.raises(ProfilingConfigError):
        ProfilingMode(observe=True, report_path=Path("/x"), max_iterations=3)
    assert ProfilingMode.observer_from_env({}) is None
    assert ProfilingMode.observer_from_env({ENV_ITERATION_REPORT: "/r", "MUXFLOW_PROFILE_SECONDS": "3"}) is None
    assert ProfilingMode.observer_from_env({ENV_ITERATION_REPORT: "/r"}).report_path == Path("/r")


def test_an_observed_window_left_open_stops_growing(tmp_path: Path) -> None:
    clock = FakeClock()
    s = ProfileSession(ProfilingMode(observe=True, report_path=tmp_path / "r.json"), clock, clock)
    for _ in range(OBSERVE_KEEP + 50):
        clock.t += 0.01
        assert s.iteration_done() is None
    assert s.timer.count == OBSERVE_KEEP and len(s.iteration_end_wall) == OBSERVE_KEEP
