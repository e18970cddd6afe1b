"""Profiling mode of the runtime helper (paper §6: "a few dry runs of the workload").

A job started with profiling mode on runs as a *dry run*: it neither reads nor
writes checkpoints, times every iteration, and stops cleanly (exit status 0)
after ``max_iterations`` measured iterations or ``max_seconds`` seconds,
whichever comes first, writing a JSON iteration report (mean/p50/p95 iteration
time). The solo profiler (``executors.scheduler.profiling``) turns it on through the
environment, so a job that uses :class:`executors.job.runtime.Runtime` needs no
change to be profiled:

| variable | meaning |
|---|---|
| ``MUXFLOW_PROFILE_ITERS`` | stop after this many measured iterations (after warm-up) |
| ``MUXFLOW_PROFILE_SECONDS`` | stop after this many seconds (from the start of the runtime) |
| ``MUXFLOW_PROFILE_WARMUP`` | iterations left out of the statistics (default 2: lazy init, autotuning) |
| ``MUXFLOW_PROFILE_REPORT`` | where the report goes (default: stdout only) |

Setting either of the first two turns profiling mode on. While it runs the
report is rewritten at most once per ``progress_interval_s`` with ``final:
false``, so whoever watches the job sees that iterations are being reported
even if the job is later killed.

**Observing** (``MUXFLOW_ITERATION_REPORT`` alone, what a node's TaskProlog sets for a job in its profiling
window on the profile partition): the job is not a dry run. It trains, resumes from and writes checkpoints as
always and never stops by itself; the runtime only times its iterations and keeps the same report up to date
in that file (``observed: true``), so the node agent can measure the window. MuxFlow ends the window by
requeueing the job, whose checkpoint on the signal keeps the window's progress.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executors.job.runtime.timing import Clock, IterationTimer, finite_or_none, write_json_atomic

REPORT_FORMAT = "muxflow-iteration-report/1"
ENV_ITERS = "MUXFLOW_PROFILE_ITERS"
ENV_SECONDS = "MUXFLOW_PROFILE_SECONDS"
ENV_WARMUP = "MUXFLOW_PROFILE_WARMUP"
ENV_REPORT = "MUXFLOW_PROFILE_REPORT"
ENV_ITERATION_REPORT = "MUXFLOW_ITERATION_REPORT"
OBSERVE_KEEP = 10_000  # iterations an observed window times at most (a window left open must not grow forever)
STDOUT_MARKER = "MUXFLOW-ITERATION-REPORT "

# Why a profiling run stopped.
STOP_ITERATIONS = "iterations"
STOP_SECONDS = "seconds"
STOP_SIGNAL = "signal"
STOP_FINISHED = "finished"  # the job ran out of steps before either limit


class ProfilingConfigError(ValueError):
    """A profiling setting that cannot be used; the message names it."""


@dataclass(frozen=True)
class ProfilingMode:
    max_iterations: int | None = None
    max_seconds: float | None = None
    warmup_iterations: int = 2
    report_path: Path | None = None
    progress_interval_s: float = 1.0
    observe: bool = False  # time and report only: the job runs on, as without profiling

    def __post_init__(self) -> None:
        if self.observe:
            if self.report_path is None or self.max_iterations is not None or self.max_seconds is not None:
                raise ProfilingConfigError(f"observing needs {ENV_ITERATION_REPORT} and no iteration or time limit")
        elif self.max_iterations is None and self.max_seconds is None:
            raise ProfilingConfigError(f"profiling mode needs {ENV_ITERS} or {ENV_SECONDS} (or both)")
        if self.max_iterations is not None and self.max_iterations < 1:
            raise ProfilingConfigError(f"{ENV_ITERS}: must be >= 1, got {self.max_iterations}")
        if self.max_seconds is not None and not (math.isfinite(self.max_seconds) and self.max_seconds > 0):
            raise ProfilingConfigError(f"{ENV_SECONDS}: must be a positive number of seconds, got {self.max_seconds}")
        if self.warmup_iterations < 0:
            raise ProfilingConfigError(f"{ENV_WARMUP}: must be >= 0, got {self.warmup_iterations}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProfilingMode | None:
        """The mode the environment asks for, or None when profiling is off."""
        env = os.environ if env is None else env
        iters, secs = env.get(ENV_ITERS, "").strip(), env.get(ENV_SECONDS, "").strip()
        if not iters and not secs:
            return None
        warm = env.get(ENV_WARMUP, "").strip()
        report = env.get(ENV_REPORT, "").strip()
        return cls(
            max_iterations=_parse(ENV_ITERS, iters, int) if iters else None,
            max_seconds=_parse(ENV_SECONDS, secs, float) if secs else None,
            warmup_iterations=_parse(ENV_WARMUP, warm, int) if warm else 2,
            report_path=Path(report) if report else None,
        )

    @classmethod
    def observer_from_env(cls, env: Mapping[str, str] | None = None) -> ProfilingMode | None:
        """Observing, when the environment names an iteration report and asks for no dry run; else None."""
        env = os.environ if env is None else env
        path = env.get(ENV_ITERATION_REPORT, "").strip()
        if not path or env.get(ENV_ITERS, "").strip() or env.get(ENV_SECONDS, "").strip():
            return None
        warm = env.get(ENV_WARMUP, "").strip()
        return cls(observe=True, report_path=Path(path), warmup_iterations=_parse(ENV_WARMUP, warm, int) if warm else 2)

    def to_env(self) -> dict[str, str]:
        env = {ENV_WARMUP: str(self.warmup_iterations)}
        if self.max_iterations is not None:
            env[ENV_ITERS] = str(self.max_iterations)
        if self.max_seconds is not None:
            env[ENV_SECONDS] = repr(float(self.max_seconds))
        if self.report_path is not None:
            env[ENV_REPORT] = str(self.report_path)
        return env


def _parse(name: str, text: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise ProfilingConfigError(f"{name}: not a{'n integer' if kind is int else ' number'}: {text!r}") from None


class ProfileSession:
    """Times iterations of one profiling run and decides when it has measured enough."""

    def __init__(self, mode: ProfilingMode, clock: Clock = time.perf_counter, wall: Clock = time.time):
        self.mode = mode
        self.clock = clock
        self.wall = wall
        self.timer = IterationTimer(clock)
        self.started = clock()
        self.started_wall = wall()
        self.iteration_end_wall: list[float] = []
        self.last_step: int | None = None
        self._last_progress: float | None = None
        self.stopped_by: str | None = None

    @property
    def total_iterations(self) -> int:
        return self.timer.count

    @property
    def measured_iterations(self) -> int:
        return max(0, self.timer.count - self.mode.warmup_iterations)

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def iteration_done(self, step: int | None = None) -> str | None:
        """Record the iteration that just finished; the reason to stop now, or None to go on (always, observing)."""
        if self.mode.observe:
            if self.timer.count < OBSERVE_KEEP:
                self.timer.mark()
                self.iteration_end_wall.append(self.wall())
                self.last_step = step
            return None
        self.timer.mark()
        self.iteration_end_wall.append(self.wall())
        self.last_step = step
        if self.mode.max_iterations is not None and self.measured_iterations >= self.mode.max_iterations:
            return STOP_ITERATIONS
        if self.mode.max_seconds is not None and self.elapsed_s() >= self.mode.max_seconds:
            return STOP_SECONDS
        return None

    def report(self, stopped_by: str | None, final: bool) -> dict[str, Any]:
        durations = self.timer.durations_s
        st = self.timer.stats(self.mode.warmup_iterations)
        # Wall-clock window of the summarised iterations: the GPU metrics of exactly that window count.
        first = st.warmup
        window_start = (self.iteration_end_wall[first] - durations[first]) if st.count else None
        window_end = self.iteration_end_wall[-1] if st.count else None
        return {
            "format": REPORT_FORMAT,
            "final": final,
            "stopped_by": stopped_by,
            "iterations": st.count,
            "warmup_iterations": st.warmup,
            "total_iterations": len(durations),
            "mean_s": finite_or_none(st.mean_s),
            "p50_s": finite_or_none(st.p50_s),
            "p95_s": finite_or_none(st.p95_s),
            "min_s": finite_or_none(st.min_s),
            "max_s": finite_or_none(st.max_s),
            "first_iteration_s": durations[0] if durations else None,
            "elapsed_s": self.elapsed_s(),
            "window_start_unix": window_start,
            "window_end_unix": window_end,
            "started_unix": self.started_wall,
            "last_step": self.last_step,
            "observed": self.mode.observe,
            "max_iterations": self.mode.max_iterations,
            "max_seconds": self.mode.max_seconds,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "signal": "runtime",
        }

    def write(self, stopped_by: str | None, final: bool) -> dict[str, Any]:
        rep = self.report(stopped_by, final)
        if self.mode.report_path is not None:
            write_json_atomic(self.mode.report_path, rep)
        if final and not self.mode.observe:  # a dry run's last word; an observed job's output is its own
            import json

            print(STDOUT_MARKER + json.dumps(rep, sort_keys=True), flush=True)
        return rep

    def maybe_progress(self) -> None:
        """Rewrite the (non-final) report at most once per ``progress_interval_s``."""
        if self.mode.report_path is None:
            return
        now = self.clock()
        if self._last_progress is None or now - self._last_progress >= self.mode.progress_interval_s:
            self._last_progress = now
            self.write(None, final=False)

    def finish(self, stopped_by: str) -> dict[str, Any]:
        self.stopped_by = stopped_by
        sys.stdout.flush()
        return self.write(stopped_by, final=True)
