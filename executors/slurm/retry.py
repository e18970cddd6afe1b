"""Talking to a Slurm that may not answer: which errors are worth retrying, and retrying them with back-off.

Every wait reads the ``clock`` and calls ``sleep`` it is given (real time by default), so the
dispatcher, the job-state sync and the profiler run in tests on a fake clock in milliseconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from executors.slurm.errors import SlurmError, SlurmRestError, SlurmTransportError
from executors.slurm.scontrol import ScontrolError

log = logging.getLogger(__name__)


class SlurmUnavailable(RuntimeError):
    """slurmctld (or slurmrestd) did not answer within the retry deadline; the plan stays pending."""


def transient(exc: Exception) -> bool:
    """An error that Slurm coming back would cure: no connection, slurmctld not answering slurmrestd."""
    if isinstance(exc, SlurmTransportError):
        return True
    if isinstance(exc, SlurmRestError | ScontrolError):
        text = str(exc).lower()
        # slurmrestd up but slurmctld down: "Unable to contact slurm controller", connection refused…
        return any(w in text for w in ("contact", "connect", "timed out", "timeout", "unable to load",
                                       "communication", "socket", "refused", "resource temporarily"))
    return False


@dataclass
class Retry:
    """Retries transient Slurm errors with exponential back-off until ``deadline_s`` has passed on ``clock``."""

    deadline_s: float = 60.0
    first_wait_s: float = 0.2
    max_wait_s: float = 5.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def call(self, what: str, fn: Callable[[], object]) -> object:
        end = self.clock() + self.deadline_s
        wait = self.first_wait_s
        while True:
            try:
                return fn()
            except SlurmError as exc:
                if not transient(exc):
                    raise
                if self.clock() + wait > end:
                    raise SlurmUnavailable(f"{what}: Slurm unreachable for {self.deadline_s:.0f}s: {exc}") from exc
                log.warning("%s: %s; retrying in %.1fs", what, exc, wait)
                self.sleep(wait)
                wait = min(wait * 2, self.max_wait_s)
