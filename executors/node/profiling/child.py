"""A workload process run by the profiler on a node: its own process group, a deadline, a stderr tail.

The child is started in a new session so that stopping it reaches everything it
started (a job script's python, its data loaders). Its stderr is forwarded to
ours (the Slurm job's log) and the last few KiB kept for the failure reason.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

TAIL_BYTES = 4096


class Child:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
                 stdout: int | None = None):
        self.argv = list(argv)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, env=dict(env), cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_len = 0
        self.killed_at_deadline = False
        self._reader = threading.Thread(target=self._forward, name="muxflow-child-stderr", daemon=True)
        self._reader.start()

    def _forward(self) -> None:
        assert self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            try:
                sys.stderr.buffer.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            self._tail.append(line)
            self._tail_len += len(line)
            while self._tail_len > TAIL_BYTES and len(self._tail) > 1:
                self._tail_len -= len(self._tail.popleft())

    def stderr_tail(self) -> str:
        return b"".join(self._tail).decode(errors="replace")[-TAIL_BYTES:]

    def wait(self, deadline_s: float, stop: Callable[[], bool] = lambda: False, poll_s: float = 0.05) -> int | None:
        """Wait until the child exits, ``deadline_s`` after its start, or ``stop()``; its exit status or None."""
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._reader.join(timeout=5.0)
                return rc
            if stop():
                return None
            if time.monotonic() - self.started >= deadline_s:
                self.killed_at_deadline = True
                return None
            time.sleep(poll_s)  # polling the child's exit, not synchronising with it

    def terminate(self, grace_s: float = 5.0) -> int:
        """SIGTERM to the whole group (the runtime writes its report), SIGKILL after ``grace_s``;
        whatever of the group outlives the child is killed too."""
        self._signal_group(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            rc = self.proc.wait()
        self._signal_group(signal.SIGKILL)
        self._reader.join(timeout=5.0)
        return rc

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # the group this object created (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started
