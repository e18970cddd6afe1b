"""Workload processes of the co-location harness, forked from a server that has already imported torch.

Starting a fresh Python process that imports torch costs seconds (2.5 s of CPU on a test machine; starting
a point's service and job took about 15 s beside its 8 s window, measured on one H200 on 2026-11-27), and
the first optimizer costs another 1.5 s (``torch.optim`` imports ``torch._dynamo``). The harness therefore
starts its processes (the service and one job per MPS share, :mod:`executors.node.profiling.hosts`) from
a :mod:`multiprocessing` *fork server* whose only work is importing torch and the workloads
(``PRELOAD``): every child is a fresh fork of it, a separate process with its own CUDA context (the server
never initialises CUDA, so a child may: PyTorch's documented way to use CUDA in subprocesses), its own MPS
client and its own environment, set before anything touches the GPU. A child's stdout and stderr go to a
log file whose tail the harness reports when the child fails.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# torch._dynamo: torch.optim imports it on a first optimizer (about 1.5 s here); metrics and probe: what the
# harness's own module imports (a child re-runs the parent's main module, multiprocessing's "prepare").
PRELOAD = ["torch", "torch._dynamo", "torch.optim", "executors.job.workloads.models",
           "executors.job.workloads.device", "executors.node.profiling.hosts", "executors.node.profiling.forked",
           "executors.node.profiling.metrics", "executors.node.profiling.probe"]
TAIL_BYTES = 4096

_context: Any = None


def context(python: str | None = None):
    """The harness's fork-server context (one per process; the server starts with the first child)."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        # A child re-runs the parent's main module (multiprocessing's "prepare"): its package is preloaded too
        # (not the module itself, which runpy would then find imported already and warn about).
        main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or ""
        package = main.rpartition(".")[0]
        ctx.set_forkserver_preload(PRELOAD + ([package] if package else []))
        if python and python != sys.executable:
            ctx.set_executable(python)
        _context = ctx
    return _context


def start_server(python: str | None = None) -> None:
    """Start the fork server now: it imports torch in the background while the caller goes on."""
    context(python)
    from multiprocessing import forkserver

    forkserver.ensure_running()


def _enter(env: dict[str, str], log_path: str) -> None:
    """In the child: its own environment (before CUDA reads it) and its output to the log file."""
    os.environ.clear()
    os.environ.update(env)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _leave(rc: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    sys.exit(rc)


def service_target(env: dict[str, str], log_path: str, config: dict[str, Any]) -> None:
    """The harness's online service (:func:`executors.node.profiling.hosts.run_service`)."""
    _enter(env, log_path)
    from executors.node.profiling.hosts import ServiceConfig, run_service

    _leave(_guarded(lambda: run_service(ServiceConfig(**config))))


def job_target(env: dict[str, str], log_path: str, config: dict[str, Any]) -> None:
    """One of the harness's offline jobs (:func:`executors.node.profiling.hosts.run_job`)."""
    _enter(env, log_path)
    from executors.node.profiling.hosts import JobConfig, run_job

    _leave(_guarded(lambda: run_job(JobConfig(**config))))


def _guarded(run: Callable[[], int]) -> int:
    try:
        return run()
    except (ValueError, OSError) as exc:  # bad input or a file: one line in the log, status 2
        print(f"error: {exc}", file=sys.stderr)
        return 2


class ForkedChild:
    """One child of the fork server; the interface of :class:`executors.node.profiling.child.Child`."""

    def __init__(self, target: Callable[..., None], args: tuple, log_path: str | Path, python: str | None = None):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.started_unix = time.time()
        self.killed_at_deadline = False
        self.proc = context(python).Process(target=target, args=args, daemon=True)
        self.proc.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    def wait(self, deadline_s: float, stop: Callable[[], bool] = lambda: False, poll_s: float = 0.02) -> int | None:
        """Wait until the child exits, ``deadline_s`` after its start, or ``stop()``; its exit status or None."""
        while True:
            self.proc.join(poll_s)  # waits on the child's sentinel
            if self.proc.exitcode is not None:
                return self.proc.exitcode
            if stop():
                return None
            if time.monotonic() - self.started >= deadline_s:
                self.killed_at_deadline = True
                return None

    def terminate(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM (a job writes its report, the service stops), SIGKILL after ``grace_s``."""
        if self.proc.exitcode is None:
            self.proc.terminate()
            self.proc.join(grace_s)
            if self.proc.exitcode is None:
                self.proc.kill()
                self.proc.join(5.0)
        return self.proc.exitcode

    def stderr_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started
