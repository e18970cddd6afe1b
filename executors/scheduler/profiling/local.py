"""Profiling and sampling jobs as subprocesses on this machine (tests; ``muxflow profile --local``).

Same job scripts as on Slurm. ``slots`` plays the partition's GPUs: at most that
many runs execute at once, the others wait (pending) in submission order — one
slot by default, so measurements on a small machine do not disturb each other.
The time limit is enforced by the controllers' bounds; :meth:`cancel` stops the
whole process group. Handles live in memory: a controller that restarts finds
its local runs lost and fails them with that reason.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import IO

from executors.scheduler.profiling.runs import (
    PHASE_FINISHED,
    PHASE_PENDING,
    PHASE_RUNNING,
    ExecStatus,
    ExecutorError,
    JobScript,
    RunSpec,
    command_script,
)
from scheduler_core.jobs.sync import ClusterView


@dataclass
class _Run:
    spec: RunSpec
    proc: subprocess.Popen | None = None
    started: dt.datetime | None = None
    out: IO[bytes] | None = field(default=None, repr=False)
    cancelled: bool = False


class LocalProfileExecutor:
    kind = "local"
    persistent = False
    report_owner = os.geteuid()  # the runs are this process's: a report of anyone else's is not theirs

    def __init__(self, env: dict[str, str] | None = None, slots: int = 1):
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.env = dict(os.environ if env is None else env)
        self.slots = slots
        self._runs: dict[int, _Run] = {}
        self._ids = itertools.count(1)

    def submit(self, spec: RunSpec) -> int:
        handle = next(self._ids)
        (spec.run_dir / "run.sh").write_text(spec.script)
        self._runs[handle] = _Run(spec)
        self._schedule()
        return handle

    def _running(self) -> int:
        return sum(1 for r in self._runs.values() if r.proc is not None and r.proc.poll() is None)

    def _schedule(self) -> None:
        for r in self._runs.values():
            if self._running() >= self.slots:
                return
            if r.proc is None and not r.cancelled:
                self._start(r)

    def _start(self, r: _Run) -> None:
        r.out = open(r.spec.run_dir / "local.out", "ab")  # noqa: SIM115 - closed when the run is reaped
        try:
            r.proc = subprocess.Popen(["/bin/sh", str(r.spec.run_dir / "run.sh")], cwd=r.spec.run_dir, env=self.env,
                                      stdout=r.out, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            r.out.close()
            raise ExecutorError(f"cannot start /bin/sh: {exc}") from exc
        r.started = dt.datetime.now(dt.UTC)

    def find(self, spec: RunSpec) -> int | None:
        return None

    def status(self, handle: int) -> ExecStatus:
        r = self._runs.get(handle)
        if r is None:
            return ExecStatus(PHASE_FINISHED, state="LOST")
        self._schedule()
        if r.proc is None:
            return ExecStatus(PHASE_FINISHED, state="CANCELLED") if r.cancelled else ExecStatus(PHASE_PENDING)
        rc = r.proc.poll()
        if rc is None:
            return ExecStatus(PHASE_RUNNING, r.started, "local", "RUNNING")
        if r.out is not None:
            r.out.close()
        self._schedule()
        return ExecStatus(PHASE_FINISHED, r.started, "local", "COMPLETED" if rc == 0 else "FAILED", rc)

    def cancel(self, handle: int) -> None:
        r = self._runs.get(handle)
        if r is None:
            return
        r.cancelled = True
        if r.proc is None or r.proc.poll() is not None:
            return
        try:
            os.killpg(r.proc.pid, signal.SIGTERM)  # the session this executor started
            r.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
        except ProcessLookupError:
            pass

    def job_script(self, slurm_job_id: int | None, command: str) -> JobScript:
        if slurm_job_id is not None:
            raise ExecutorError(f"the job is Slurm job {slurm_job_id}: its script is read from Slurm "
                                "(profile it with the Slurm executor)")
        if not command.strip():
            raise ExecutorError("the job has no command to profile")
        return JobScript(command_script(command), None)

    def cluster_views(self, slurm_job_ids: list[int]) -> dict[int, ClusterView]:
        return {}  # no Slurm here: a job with a Slurm id is refused by job_script

    def close(self) -> None:
        for handle, r in self._runs.items():
            self.cancel(handle)
            if r.out is not None:
                r.out.close()
