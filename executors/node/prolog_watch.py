"""The Prolog slurmd skipped, run by the node agent for a TaskProlog that waits for its plan.

slurmd runs the Prolog for a job id it has not seen yet. A job that was requeued (a MuxFlow
eviction is a requeue-hold) and is released again on the same node shortly afterwards starts
*without* its Prolog (Slurm 22.05, with or without ``PrologFlags=Alloc``; docs/SLURM.md
"Node scripts"). The Prolog is what turns the plan in the job's admin comment into the
root-owned plan file the TaskProlog reads and what sets the MPS hard caps; without it the job
would run without xCUDA and without caps, until the xCUDA check evicted it.

So the TaskProlog of an offline job whose plan file is missing waits for it (a bounded
wait of 30 s), and this watch, on a thread of the root node agent, looks for such a waiting
TaskProlog — Slurm's TaskProlog of an offline job of this node, at least a second old, whose job has no
plan file — and runs the site's own Prolog for that job, with the environment slurmd would give it
(``SLURM_JOB_ID``, ``SLURMD_NODENAME``, ``SLURM_JOB_PARTITION``, the job's uid, gid and user, the node's ``PATH``,
``SLURM_CONF`` and the ``MUXFLOW_*`` settings the Prolog reads; nothing else of the agent's); a TaskProlog of
another node (its ``SLURMD_NODENAME``; the dev cluster's nodes share one ``/proc``) is left alone.
The Prolog decides as always: it reads the admin comment, writes the plan file, sets the
caps; for a job that is not a MuxFlow placement it does nothing. One run per waiting
TaskProlog process: a Prolog that found no plan is not retried for the same process.

Root runs the Prolog on the word of a process of the job's user, so that word is checked
(:func:`executors.node.attribution.task_prolog_of`): its name, its environment and its argv are its own to
forge, so the job and the user come from what the user cannot forge — the process is under the job's root
``slurmstepd: [<job>.<step>]`` (a user cannot put his process under another job's), runs exactly the
configured TaskProlog script, and its job id (slurmstepd's title) is the one in its environment; the
job's uid and gid are the process's, as the kernel reports them (``/proc/<pid>/status``, not the owner of
``/proc/<pid>``, which ``prctl(PR_SET_DUMPABLE, 0)`` makes root). When the agent can ask Slurm
(``slurm_job``), the job must also be Slurm's record of a job of that user, on this node, in the offline
partition. What a user can still forge proves his own running job only, for which the Prolog does what
slurmd would have done.

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

from executors.node.attribution import (
    TASK_PROLOG_NAME,
    TaskPrologOf,
    default_task_prolog,
    proc_env,
    task_prolog_of,
)
from executors.node.xcuda_check import read_procs

log = logging.getLogger(__name__)

# What the Prolog gets of the agent's own environment, as slurmd gives it little more than the job's identity: the
# agent's holds its secrets (the store's URL, tokens), and what the Prolog starts (the MPS control daemon, whose
# servers run as the jobs' users) would carry them on. The node's PATH, not the agent's.
PROLOG_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROLOG_SETTINGS = ("SLURM_CONF", "MUXFLOW_NODE_LOG_DIR", "MUXFLOW_MPS_PIPE_ROOT", "MUXFLOW_OFFLINE_PARTITION",
                   "MUXFLOW_PROFILE_PARTITION")


@dataclass(frozen=True)
class PrologRun:
    slurm_job_id: int
    task_prolog_pid: int
    ok: bool
    detail: str


@dataclass(frozen=True)
class SlurmJobFacts:
    """Slurm's record of a job, as far as the watch checks a TaskProlog against it."""

    user_name: str
    partition: str
    nodes: tuple[str, ...]
    state: str


@dataclass(frozen=True)
class _Waiting:
    who: TaskPrologOf
    partition: str | None  # from the TaskProlog's environment (Slurm's, when the agent can ask, wins)


def slurm_job_facts(client_factory: Callable[[], object]) -> Callable[[int], SlurmJobFacts | None]:
    """Slurm's record of a job through a Slurm REST client (``client_factory()``), one request per waiting
    TaskProlog."""

    def facts(slurm_job_id: int) -> SlurmJobFacts | None:
        client = client_factory()
        try:
            j = client.get_job(slurm_job_id)
        finally:
            close = getattr(client, "close", None)
            if close is not None:
                close()
        return SlurmJobFacts(j.user_name, j.partition, tuple(j.nodes), j.state)

    return facts


class PrologWatch:
    """Runs ``prolog`` for each TaskProlog on ``node`` that waits for a missing ``plan_dir/<job>.plan``.

    ``task_prolog``: the TaskProlog script Slurm runs (default: slurm.conf's ``TaskProlog=``, from ``env``'s
    ``SLURM_CONF``, else ``task_prolog.sh`` beside the Prolog). ``slurm_job``: Slurm's record of a job (None: the
    agent cannot ask; an exception or None from it: Slurm unavailable, the process tree's word stands)."""

    def __init__(self, prolog: Path | str, plan_dir: Path | str, node: str, *, proc_root: Path | str = "/proc",
                 env: Mapping[str, str] | None = None, timeout_s: float = 60.0, offline_partition: str = "offline",
                 min_wait_s: float = 1.0, task_prolog_name: str | None = None,
                 task_prolog: Path | str | None = None,
                 slurm_job: Callable[[int], SlurmJobFacts | None] | None = None,
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
        self.task_prolog = str(task_prolog) if task_prolog is not None else \
            default_task_prolog(self.prolog, self.env.get("SLURM_CONF"))
        name = task_prolog_name or (Path(self.task_prolog).name if self.task_prolog else TASK_PROLOG_NAME)
        self._name = name
        self.task_prolog_name = name[:15]  # /proc cuts names to 15 bytes
        self.slurm_job = slurm_job
        self._run = run
        self._done: set[tuple[int, int]] = set()
        self._not_genuine: set[int] = set()

    def waiting(self) -> dict[tuple[int, int], _Waiting]:
        """(Slurm job id, TaskProlog pid) → who, for every genuine TaskProlog whose job has no plan file."""
        procs = read_procs(self.proc_root)
        out: dict[tuple[int, int], _Waiting] = {}
        for pid, p in procs.items():
            if p.comm != self.task_prolog_name or p.age_s < self.min_wait_s:
                continue
            who = task_prolog_of(pid, procs, self.proc_root, self.task_prolog, self._name)
            if who is None:
                if pid not in self._not_genuine:
                    self._not_genuine.add(pid)
                    log.warning("process %d is named like the TaskProlog but is not Slurm's TaskProlog %s of a job "
                                "(under its slurmstepd, with its job id): ignored", pid, self.task_prolog)
                continue
            env = proc_env(pid, self.proc_root, "SLURMD_NODENAME", "SLURM_JOB_PARTITION")
            if env.get("SLURMD_NODENAME", self.node) != self.node:
                continue  # another node's task (several dev-cluster nodes share one /proc)
            if self.offline_partition not in env.get("SLURM_JOB_PARTITION", "").split(","):
                continue
            if not (self.plan_dir / f"{who.slurm_job_id}.plan").exists():
                out[(who.slurm_job_id, pid)] = _Waiting(who, env.get("SLURM_JOB_PARTITION"))
        self._not_genuine &= set(procs)
        return out

    def _owner(self, who: TaskPrologOf) -> dict[str, str]:
        """The job's user as slurmd gives it to the Prolog: the TaskProlog process's uid and gid (the kernel's)."""
        out = {"SLURM_JOB_UID": str(who.uid), "SLURM_UID": str(who.uid)}
        if who.gid is not None:
            out["SLURM_JOB_GID"] = str(who.gid)
        try:
            out["SLURM_JOB_USER"] = pwd.getpwuid(who.uid).pw_name
        except KeyError:
            pass
        return out

    def _slurm_says(self, sid: int, who: TaskPrologOf) -> tuple[SlurmJobFacts | None, str | None]:
        """(Slurm's record of the job or None, why the Prolog must not run or None)."""
        if self.slurm_job is None:
            return None, None
        try:
            facts = self.slurm_job(sid)
        except Exception as exc:  # slurmrestd away: the process tree's word stands
            log.warning("Slurm's record of job %d unavailable (%s: %s): going by its TaskProlog's process tree", sid,
                        exc.__class__.__name__, exc)
            return None, None
        if facts is None:
            return None, None
        problems = []
        if facts.user_name:
            try:
                uid: int | None = pwd.getpwnam(facts.user_name).pw_uid
            except KeyError:
                uid = None
            if uid != who.uid:
                problems.append(f"Slurm says the job is {facts.user_name}'s (uid {uid}), its TaskProlog runs as "
                                f"uid {who.uid}")
        if self.node not in facts.nodes:
            problems.append(f"Slurm says it runs on {','.join(facts.nodes) or 'no node'}, not {self.node}")
        if self.offline_partition not in facts.partition.split(","):
            problems.append(f"Slurm says its partition is {facts.partition!r}")
        return facts, "; ".join(problems) or None

    def once(self) -> list[PrologRun]:
        runs = []
        waiting = self.waiting()
        for (sid, pid), w in sorted(waiting.items()):
            if (sid, pid) in self._done:
                continue
            self._done.add((sid, pid))
            facts, refused = self._slurm_says(sid, w.who)
            if refused:
                log.error("Slurm job %d: TaskProlog %d waits for its plan, but %s: the Prolog is not run", sid, pid,
                          refused)
                continue
            partition = facts.partition if facts is not None else w.partition
            env = {"PATH": PROLOG_PATH, **{k: self.env[k] for k in PROLOG_SETTINGS if k in self.env},
                   "SLURM_JOB_ID": str(sid), "SLURMD_NODENAME": self.node,
                   "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "MUXFLOW_PROLOG_BY": "node-agent",
                   **self._owner(w.who)}
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
