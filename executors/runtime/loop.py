"""The training-loop side of checkpoint/restart (DESIGN §3 step 9).

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
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

from executors.runtime.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

EXIT_CHECKPOINTED = 0  # a checkpointed exit is a clean one; the dispatcher's requeue brings the job back


class Runtime:
    def __init__(self, checkpoint_dir: str | os.PathLike[str], every_steps: int = 100, keep: int = 2,
                 signals: Iterable[int] = (signal.SIGUSR1, signal.SIGTERM),
                 exit: Callable[[int], Any] = sys.exit):
        if every_steps < 1:
            raise ValueError("every_steps must be at least 1")
        self.store = CheckpointStore(checkpoint_dir, keep=keep)
        self.every_steps = every_steps
        self.stop_requested: int | None = None
        self._exit = exit
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only a flag: the iteration in progress finishes before anything is saved.
        self.stop_requested = signum

    def resume(self) -> tuple[int, Any]:
        found = self.store.latest()
        if found is None:
            return 0, None
        log.info("resuming from checkpoint at step %d", found[0])
        return found

    def step_done(self, step: int, state: Callable[[], Any]) -> None:
        """Call after each finished iteration; saves on the interval, and saves and exits when signalled."""
        if self.stop_requested is not None:
            self.store.save(step, state())
            log.info("signal %d: checkpointed step %d, exiting for requeue", self.stop_requested, step)
            sys.stdout.flush()
            self._exit(EXIT_CHECKPOINTED)
            return
        if step % self.every_steps == 0:
            self.store.save(step, state())
