"""The training-loop side of checkpoint/restart (docs/ARCHITECTURE.md, "What runs where": inside a job).

    rt = Runtime(os.environ.get("MUXFLOW_CHECKPOINT_DIR", ckpt_dir), every_steps=50)
    step, state = rt.resume()            # (0, None) on a first start
    if state: model.load_state_dict(state["model"]); ...
    while step < total:
        train_one_iteration()
        step += 1
        rt.step_done(step, lambda: {"model": model.state_dict(), ...})

On ``SIGUSR1`` (the dispatcher's checkpoint signal before a migration or
eviction) or ``SIGTERM`` (Slurm's requeue/cancel), the handler only sets a
flag: the current iteration finishes, ``step_done`` saves a checkpoint
atomically and the process exits with :data:`EXIT_CHECKPOINTED`, so Slurm can
requeue it. Otherwise a checkpoint is written every ``every_steps`` steps: at
most one interval of work is ever lost (a SIGKILL mid-iteration).

Iteration timing: ``step_done`` marks the end of an iteration, so
``rt.timer`` holds the time between consecutive calls; wrapping the step in
``with rt.iteration():`` times exactly that block instead.

Profiling mode (:mod:`executors.job.runtime.profiling`, on when the environment
sets ``MUXFLOW_PROFILE_ITERS`` or ``MUXFLOW_PROFILE_SECONDS``, or given as
``profiling=``): the run is a dry run (no checkpoint is read or written) that
stops cleanly after N measured iterations or T seconds and writes the
iteration report (mean/p50/p95). A checkpoint signal ends it the same way,
with ``stopped_by: signal``.

Observing (``MUXFLOW_ITERATION_REPORT``, a job's profiling window on the profile partition): the job runs
as always (resume, checkpoints, the signal's checkpoint and exit) and its iterations are timed into that
report besides.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from executors.job.runtime.checkpoint import CheckpointStore
from executors.job.runtime.profiling import STOP_FINISHED, STOP_SIGNAL, ProfileSession, ProfilingMode
from executors.job.runtime.timing import Clock, IterationTimer

log = logging.getLogger(__name__)

EXIT_CHECKPOINTED = 0  # a checkpointed exit is a clean one; the dispatcher's requeue brings the job back
EXIT_PROFILED = 0  # profiling mode stopped after its iterations/seconds: a clean exit
FROM_ENV = object()  # profiling mode as the environment says (the default)
TIMER_KEEP = 10_000  # iteration durations kept outside profiling mode


class Runtime:
    def __init__(self, checkpoint_dir: str | os.PathLike[str], every_steps: int = 100, keep: int = 2,
                 signals: Iterable[int] = (signal.SIGUSR1, signal.SIGTERM),
                 exit: Callable[[int], Any] = sys.exit, profiling: ProfilingMode | None | object = FROM_ENV,
                 clock: Clock = time.perf_counter, wall: Clock = time.time):
        if every_steps < 1:
            raise ValueError("every_steps must be at least 1")
        self.store = CheckpointStore(checkpoint_dir, keep=keep)
        self.every_steps = every_steps
        self.stop_requested: int | None = None
        self._exit = exit
        mode = ProfilingMode.from_env() if profiling is FROM_ENV else profiling
        if mode is not None and not isinstance(mode, ProfilingMode):
            raise TypeError(f"profiling: expected a ProfilingMode or None, got {type(mode).__name__}")
        self.profile: ProfileSession | None = ProfileSession(mode, clock, wall) if mode else None
        self.timer = self.profile.timer if self.profile else IterationTimer(clock, keep=TIMER_KEEP)
        observe = ProfilingMode.observer_from_env() if profiling is FROM_ENV and mode is None else None
        self.observer: ProfileSession | None = ProfileSession(observe, clock, wall) if observe else None
        if self.profile is not None:
            log.info("profiling mode: dry run, stop after %s iterations / %s s", mode.max_iterations, mode.max_seconds)
            atexit.register(self.finish_profile)
        if self.observer is not None:
            log.info("iterations timed into %s (profiling window)", observe.report_path)
            # the start-up hook (runtime/hook) defers to this process for this report, and only for this one
            os.environ["MUXFLOW_ITERATION_REPORT_OWNER"] = str(observe.report_path)
            atexit.register(self.finish_observing)
        for sig in signals:
            signal.signal(sig, self._on_signal)

    @property
    def profiling(self) -> bool:
        return self.profile is not None

    def iteration(self) -> AbstractContextManager[None]:
        """``with rt.iteration(): step()`` times exactly the step (else the time between ``step_done`` calls)."""
        return self.timer.iteration()

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only a flag: the iteration in progress finishes before anything is saved.
        self.stop_requested = signum

    def resume(self) -> tuple[int, Any]:
        if self.profile is not None:
            return 0, None  # a dry run: never starts from (nor leaves) a checkpoint
        found = self.store.latest()
        if found is None:
            return 0, None
        log.info("resuming from checkpoint at step %d", found[0])
        return found

    def step_done(self, step: int, state: Callable[[], Any]) -> None:
        """Call after each finished iteration; saves on the interval, and saves and exits when signalled."""
        if self.profile is not None:
            self._profile_step(step)
            return
        self.timer.mark()
        if self.observer is not None:
            try:
                self.observer.iteration_done(step)
                self.observer.maybe_progress()
            except OSError as exc:  # the report cannot be written: the job trains on, unobserved
                log.warning("iteration report: %s; no longer reported", exc)
                atexit.unregister(self.finish_observing)
                self.observer = None
        if self.stop_requested is not None:
            self.finish_observing()
            self.store.save(step, state())
            log.info("signal %d: checkpointed step %d, exiting for requeue", self.stop_requested, step)
            sys.stdout.flush()
            self._exit(EXIT_CHECKPOINTED)
            return
        if step % self.every_steps == 0:
            self.store.save(step, state())

    def _profile_step(self, step: int) -> None:
        assert self.profile is not None
        if self.profile.stopped_by is not None:
            return  # already reported (an exit that returned, as in tests)
        reason = self.profile.iteration_done(step)
        if self.stop_requested is not None:
            reason = STOP_SIGNAL
        if reason is None:
            self.profile.maybe_progress()
            return
        rep = self.profile.finish(reason)
        atexit.unregister(self.finish_profile)
        log.info("profiling done (%s): %d iterations, mean %.4fs", reason, rep["iterations"], rep["mean_s"] or 0.0)
        self._exit(EXIT_PROFILED)

    def finish_observing(self) -> dict[str, Any] | None:
        """The observed window's final report (at the checkpoint signal, or at exit); idempotent."""
        if self.observer is None or self.observer.stopped_by is not None:
            return None
        atexit.unregister(self.finish_observing)
        try:
            return self.observer.finish(STOP_SIGNAL if self.stop_requested is not None else STOP_FINISHED)
        except OSError as exc:  # the report's directory is gone (the window ended): the job goes on regardless
            log.warning("cannot write the iteration report: %s", exc)
            return None

    def finish_profile(self) -> dict[str, Any] | None:
        """Write the final report if the job ends before a limit (called at exit too); idempotent."""
        if self.profile is None or self.profile.stopped_by is not None:
            return None
        atexit.unregister(self.finish_profile)
        return self.profile.finish(STOP_SIGNAL if self.stop_requested is not None else STOP_FINISHED)


def restore_training(state: Any, model: Any, optimizer: Any) -> float:
    """Load a resumed ``{"model", "opt", "loss"}`` checkpoint into a PyTorch model and optimizer.

    Returns the loss saved with it, or NaN on a first start (``state`` is None).
    """
    if state is None:
        return float("nan")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["opt"])
    return state["loss"]
