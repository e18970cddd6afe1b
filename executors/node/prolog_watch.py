"""The Prolog slurmd skipped, run by the node agent for a TaskProlog that waits for its plan.

slurmd runs the Prolog for a job id it has not seen yet. A job that was requeued (a MuxFlow
eviction is a requeue-hold) and is released again on the same node shortly afterwards starts
*without* its Prolog (Slurm 22.05, with or without ``PrologFlags=Alloc``; docs/SLURM.md
"Node scripts"). The Prolog is what turns the plan in the job's admin comment into the
root-owned plan file the TaskProlog reads and what sets the MPS hard caps; without it the job
would run without xCUDA and without caps, until the xCUDA check evicted it.

So the TaskProlog of an offline job whose plan file is missing waits for it (a bounded
wait of 30 s), and this watch, on a thread of the root node agent, looks for such a waiting
TaskProlog — a process named like the TaskProlog script, of an offline job of this node, at least
a second old, whose ``SLURM_JOB_ID`` has no plan file — and runs the site's own Prolog for that job, with
the environment slurmd would give it (``SLURM_JOB_ID``, ``SLURMD_NODENAME``, ``SLURM_JOB_PARTITION``); a
TaskProlog of another node (its ``SLURMD_NODENAME``; the dev cluster's nodes share one ``/proc``) is left alone.
The Prolog decides as always: it reads the admin comment, writes the plan file, sets the
caps; for a job that is not a MuxFlow placement it does nothing. One run per waiting
TaskProlog process: a Prolog that found no plan is not retried for the same process.

Only a waiting TaskProlog triggers it, never a job's other processes: the Epilog removes the
plan file while a finished job's processes may still be exiting, and running the Prolog then
would leave the caps of a job that has ended.
"""

from __future__ import annotations

import logging
import os
import pwd
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from executors.node.attribution import TASK_PROLOG_NAME, proc_env
from executors.node.xcuda_check import read_procs

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class PrologRun:
    slurm_job_id: int
    task_prolog_pid: int
    ok: bool
    detail: str


class PrologWatch:
    """Runs ``prolog`` for each TaskProlog on ``node`` that waits for a missing ``plan_dir/<job>.plan``."""

    def __init__(self, prolog: Path | str, plan_dir: Path | str, node: str, *, proc_root: Path | str = "/proc",
                 env: Mapping[str, str] | None = None, timeout_s: float = 60.0, offline_partition: str = "offline",
                 min_wait_s: float = 1.0, task_prolog_name: str = TASK_PROLOG_NAME,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run):
        self.prolog = Path(prolog)
        self.plan_dir = Path(plan_dir)
        self.node = node
        self.proc_root = Path(proc_root)
        self.env = dict(os.environ if env is None else env)
        self.timeout_s = timeout_s
        # Only offline jobs' TaskPrologs wait for a plan; others end in milliseconds, as does one whose plan is
        # there: a TaskProlog younger than min_wait_s is not waiting yet.
        self.offline_partition = offline_partition
        self.min_wait_s = min_wait_s
        self.task_prolog_name = task_prolog_name[:15]  # /proc cuts names to 15 bytes
        self._run = run
        self._done: set[tuple[int, int]] = set()

    def waiting(self) -> dict[tuple[int, int], str | None]:
        """(Slurm job id, TaskProlog pid) → the job's partition, for every TaskProlog whose job has no plan file."""
        procs = read_procs(self.proc_root)
        keys = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_JOB_PARTITION")
        out: dict[tuple[int, int], str | None] = {}
        for pid, p in procs.items():
            if p.comm != self.task_prolog_name:
                continue
            env = proc_env(pid, self.proc_root, *keys)
            if env.get("SLURMD_NODENAME", self.node) != self.node:
                continue  # another node's task (several dev-cluster nodes share one /proc)
            if self.offline_partition not in env.get("SLURM_JOB_PARTITION", "").split(",") or p.age_s < self.min_wait_s:
                continue
            try:
                sid = int(env["SLURM_JOB_ID"])
            except (KeyError, ValueError):
                continue
            if not (self.plan_dir / f"{sid}.plan").exists():
                out[(sid, pid)] = env.get("SLURM_JOB_PARTITION")
        return out

    def _owner(self, pid: int) -> dict[str, str]:
        """The job's user as slurmd gives it to the Prolog, from the TaskProlog process's owner (which the
        kernel reports; its environment is the job's own to set)."""
        try:
            st = (self.proc_root / str(pid)).stat()
        except OSError:
            return {}
        out = {"SLURM_JOB_UID": str(st.st_uid), "SLURM_UID": str(st.st_uid), "SLURM_JOB_GID": str(st.st_gid)}
        try:
            out["SLURM_JOB_USER"] = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            pass
        return out

    def once(self) -> list[PrologRun]:
        runs = []
        waiting = self.waiting()
        for (sid, pid), partition in sorted(waiting.items()):
            if (sid, pid) in self._done:
                continue
            self._done.add((sid, pid))
            env = {**self.env, "SLURM_JOB_ID": str(sid), "SLURMD_NODENAME": self.node,
                   "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "MUXFLOW_PROLOG_BY": "node-agent",
                   **self._owner(pid)}
            if partition:
                env["SLURM_JOB_PARTITION"] = partition
            try:
                done = self._run([str(self.prolog)], env=env, capture_output=True, text=True, timeout=self.timeout_s)
                ok = done.returncode == 0
                detail = f"exit {done.returncode}" + (f": {done.stderr.strip()[-300:]}" if done.stderr.strip() else "")
            except (OSError, subprocess.SubprocessError) as exc:
                ok, detail = False, str(exc)
            plan = (self.plan_dir / f"{sid}.plan").exists()
            run = PrologRun(sid, pid, ok, f"{detail}; plan file {'written' if plan else 'not written'}")
            (log.warning if ok else log.error)("Slurm job %d started without its Prolog (TaskProlog %d waits for "
                                               "its plan): ran %s: %s", sid, pid, self.prolog, run.detail)
            runs.append(run)
        self._done &= set(waiting)  # a TaskProlog that ended or got its plan is forgotten
        return runs


class PrologWatchThread:
    """A :class:`PrologWatch` every ``interval_s`` on a thread of its own."""

    def __init__(self, watch: PrologWatch, interval_s: float = 0.5):
        self.watch = watch
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prolog-watch", daemon=True)

    def start(self) -> PrologWatchThread:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.watch.once()
            except Exception:  # a bad /proc read must not end the watch
                log.exception("prolog watch failed; trying again")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
