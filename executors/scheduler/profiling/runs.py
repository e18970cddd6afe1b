"""What the profiling controllers ask of the place profiling jobs run: the executor interface.

Two implementations: :class:`executors.scheduler.profiling.slurm_exec.SlurmProfileExecutor`
(the ``profile`` partition through slurmrestd) and
:class:`executors.scheduler.profiling.local.LocalProfileExecutor` (subprocesses on this
machine: tests, and ``muxflow profile --local``). Both run the same generated
job script (:func:`probe_script` / the co-location harness's), so everything
from the script on is the same code.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from scheduler_core.jobs.sync import ClusterView

PHASE_PENDING = "pending"
PHASE_RUNNING = "running"
PHASE_FINISHED = "finished"


class ExecutorUnavailable(RuntimeError):
    """The executor could not be reached (e.g. Slurm down): try again later, nothing is lost."""


class ExecutorError(RuntimeError):
    """The executor refused the request for a reason retrying cannot fix."""


@dataclass(frozen=True)
class RunSpec:
    """One profiling or sampling job to run on a GPU of ``gpu_type``."""

    key: str              # unique per run, carried in the job's comment (finds a run after a crash)
    name: str
    gpu_type: str
    run_dir: Path
    script: str           # the job script (starts with #!)
    time_limit_s: float   # hard limit of the job (the executor kills it after this)


@dataclass(frozen=True)
class ExecStatus:
    phase: str                       # PHASE_*
    started_utc: dt.datetime | None = None
    node: str | None = None
    state: str | None = None         # the executor's own state name (Slurm's job state)
    exit_code: int | None = None


@dataclass(frozen=True)
class JobScript:
    text: str
    working_dir: str | None


class ProfileExecutor(Protocol):
    kind: str               # 'slurm' | 'local'
    persistent: bool        # handles survive a restart of the controller (Slurm job ids do)

    def submit(self, spec: RunSpec) -> int:
        """Start the run; its handle. ExecutorUnavailable / ExecutorError."""
        ...

    def find(self, spec: RunSpec) -> int | None:
        """The handle of a run submitted earlier under ``spec.key`` (a crash after submitting), if any."""
        ...

    def status(self, handle: int) -> ExecStatus:
        ...

    def cancel(self, handle: int) -> None:
        ...

    def job_script(self, slurm_job_id: int | None, command: str) -> JobScript:
        """The script a profiling copy of a job runs: its Slurm batch script, else its command."""
        ...

    def cluster_views(self, slurm_job_ids: list[int]) -> dict[int, ClusterView]:
        """What the cluster says of these users' own jobs (the jobs being profiled, not the runs); jobs the
        executor cannot know of are left out. ExecutorUnavailable."""
        ...


def command_script(command: str) -> str:
    """The batch script of ``muxflow submit <command>``. Slurm signals the batch shell too when MuxFlow asks a job
    to checkpoint (SIGUSR1, then SIGTERM), and (``proctrack/cgroup``) kills what is left of the job once the shell
    ends; the shell ignores both, so that it lives on while the program checkpoints (its handlers are its own)."""
    return ("#!/bin/sh\n# the job's command (muxflow submit)\n"
            "trap '' USR1 TERM  # MuxFlow's checkpoint signals are for the program, not this shell\n"
            + command.rstrip() + "\n")


class ProfileDirError(RuntimeError):
    """A profiling directory that is not MuxFlow's alone to use; the message names it and why, on one line."""


def _trusted_base(root: Path, owner_uid: int | None) -> os.stat_result:
    """``root`` made (0755) when missing; else used only when it is a directory (not a link) of root, this account or
    the reference account (``owner_uid``), that others cannot write to (group members only where the site made it
    a shared setgid group directory): the runs' samples train every predictor, so a directory someone else made
    first (``/tmp/muxflow-profiling``, say) is never used."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(root)
    mode = stat.S_IMODE(st.st_mode)
    why = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory" if not stat.S_ISDIR(st.st_mode)
           else f"is owned by uid {st.st_uid}, not root, this account ({os.geteuid()}) or the reference account"
           if st.st_uid not in {0, os.geteuid(), owner_uid} - {None}
           else f"has mode {mode:04o}: others can write to it" if mode & 0o002
           else f"has mode {mode:04o}: its group can write to it (a shared group needs the setgid bit: 2770)"
           if mode & 0o020 and not mode & stat.S_ISGID else None)
    if why is not None:
        raise ProfileDirError(f"profile_dir {root} {why}: not used (someone else's directory could plant the runs' "
                              f"reports); make it: install -d -o <muxflow account> -m 0755 {root}")
    return st


def prepare_run_dir(base: str, name: str, owner_uid: int | None = None) -> Path:
    """A new directory for one run, never world-writable, in a ``base`` that is MuxFlow's alone
    (:func:`_trusted_base`).

    The run's jobs write into it: as the reference account (``owner_uid``), which gets it (mode 0755) where this
    process is root; in a shared setgid group directory (mode 2770: MuxFlow's and the reference account, no one
    else), the group; else it is this account's (0755: the local executor's runs are this process's).
    The name gets a random suffix: run ids restart with every feature store, and two stores (or a
    store rebuilt) sharing one profile directory and one Slurm must never meet in a directory or in
    a job comment (the run's key is the directory's name).
    """
    root = Path(base)
    st = _trusted_base(root, owner_uid)
    d = root / f"{name}-{secrets.token_hex(4)}"
    d.mkdir(mode=0o700, exist_ok=False)  # a fresh one: never someone else's
    if os.geteuid() == 0 and owner_uid not in (None, 0):
        import pwd

        try:
            gid = pwd.getpwuid(owner_uid).pw_gid
        except KeyError:
            gid = -1
        os.chown(d, owner_uid, gid)
        os.chmod(d, 0o755)
    elif stat.S_IMODE(st.st_mode) & 0o020:
        os.chmod(d, 0o2770)
    else:
        os.chmod(d, 0o755)
    return d


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | stat.S_IRGRP | stat.S_IROTH)
    return path


def probe_script(*, python: str, run_dir: Path, job_script: Path, job_type: str, gpu_type: str, metrics: str,
                 iterations: int, seconds: float, warmup: int, deadline_s: float, seed: int, interval_ms: float,
                 working_dir: str | None, header: str, mem_bytes: int | None = None) -> str:
    """The profiling job: the probe around a copy of the job's script, in the job's working directory."""
    q = shlex.quote
    args = [q(python), "-m", "executors.node.profiling.probe", "--run-dir", q(str(run_dir)), "--job-type", q(job_type),
            "--gpu-type", q(gpu_type), "--metrics", metrics, "--iters", str(iterations), "--seconds", repr(seconds),
            "--warmup", str(warmup), "--deadline", repr(deadline_s), "--seed", str(seed), "--interval-ms",
            repr(interval_ms)]
    if working_dir:
        args += ["--cwd", q(working_dir)]
    if mem_bytes:
        args += ["--mem-bytes", str(int(mem_bytes))]
    return ("#!/bin/sh\n" + "".join(f"# {line}\n" for line in header.splitlines())
            + f"cd {q(str(run_dir))} || exit 1\n"
            + "exec " + " ".join(args) + " -- " + q(str(job_script)) + "\n")


def run_log_tail(run_dir: Path, limit: int = 300) -> str:
    """The last non-empty line of the run's job log (``slurm-<id>.out`` or ``local.out``), for failure reasons."""
    logs = sorted(run_dir.glob("slurm-*.out")) + [run_dir / "local.out"]
    for log_path in reversed(logs):
        try:
            lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            return lines[-1][:limit]
    return ""


class RunHandles:
    """Where a run's executor handle lives: in its row (``slurm_job_id``) for executors whose handles
    outlive the controller, in memory otherwise (the row's ``node`` then names the executor, so a
    restarted controller knows the run is lost)."""

    def __init__(self, executor: ProfileExecutor):
        self.executor = executor
        self._memory: dict[int, int] = {}

    def record(self, store, model: type, run_id: int, handle: int) -> None:
        with store.session() as s:
            row = s.get(model, run_id)
            if self.executor.persistent:
                row.slurm_job_id = handle
            else:
                row.node = self.executor.kind
        self._memory[run_id] = handle

    def lookup(self, run_id: int, slurm_job_id: int | None) -> int | None:
        return slurm_job_id if self.executor.persistent else self._memory.get(run_id)

    def lost(self, node: str | None) -> bool:
        """A run without a handle that this kind of executor started: its process is gone."""
        return not self.executor.persistent and node == self.executor.kind
