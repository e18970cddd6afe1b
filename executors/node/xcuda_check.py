"""Offline processes that run without xCUDA: seen by the node agent and evicted (paper §4.1–4.2;
docs/NODE_AGENT.md, "The xCUDA check").

xCUDA paces an offline job's kernels and accounts its memory quota from inside the job's
processes, loaded by the ``LD_PRELOAD`` the TaskProlog exports. The environment is the job's
own: a script can ``unset LD_PRELOAD`` and run unpaced. The MPS caps the root Prolog sets stay
(docs/SLURM.md "Hard caps"), but the pacing the online service's latency relies on is gone, so
the agent compares what runs with the plan:

- the offline Slurm jobs placed on this node's GPUs come from the placements
  (:mod:`executors.node.placements`);
- a job's processes are those under its root ``slurmstepd: [<job>.<step>]`` (the process tree is
  what Slurm's ``proctrack/linuxproc`` follows too: a child started with a cleared or forged
  environment is still the job's), and those outside every job's tree whose ``SLURM_JOB_ID``
  (``/proc/<pid>/environ``, else an ancestor's) is the job's and that run as the job's user (the
  environment is the process's own: no user passes his processes off as another user's job);
- on real GPUs only the processes with a context on a GPU count (NVML's compute processes:
  a shell that loads no CUDA needs no xCUDA); on simulated GPUs every process of the job;
- Slurm's own hooks for the job never count (:func:`executors.node.attribution.in_slurm_hook`),
  nor their children; all run with the job's ``SLURM_JOB_ID`` and without xCUDA, and can take long
  on a loaded node. Each is known by what its user cannot forge, not by its name or environment:
  the Prolog and the Epilog are root's processes, children of root's slurmd (or of this agent, which
  runs the Prolog slurmd skipped), marked ``SLURM_SCRIPT_CONTEXT=prolog_slurmd|epilog_slurmd``; the
  TaskProlog is the configured script run under the job's root slurmstepd
  (:func:`executors.node.attribution.task_prolog_of`), for at most 60 s (it may wait for its plan,
  :mod:`executors.node.prolog_watch`), and on real GPUs never for a process on a GPU (it uses none);
- a process counts once it is ``grace_s`` old (a task's first moment, before its exec);
- such a process whose ``/proc/<pid>/maps`` has no ``libxcuda.so`` is a violation: the job is
  evicted (requeue-hold, as SysMonitor's evictions; Slurm's SIGTERM makes the runtime checkpoint) with that reason,
  which the ``evictions`` row and the job's EVICTED transition carry.

It runs on a thread of its own every ``interval_s``: a scan of ``/proc`` is too slow for the
10 ms sampling loop. The agent must run as root to read other users' ``environ`` and
``maps``; a process it cannot read is skipped (and logged once), never a violation.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from executors.node.attribution import (
    SLURMSTEPD,
    in_slurm_hook,
    proc_slurm_job,
    proc_uid,
    slurm_conf_task_prolog,
    stepd_title,
)

log = logging.getLogger(__name__)

XCUDA_LIB = "libxcuda.so"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    age_s: float
    comm: str
    cpu_s: float = 0.0   # CPU time it has used (user + system), its reaped children's not included


@dataclass(frozen=True)
class Violation:
    gpu_index: int
    job_id: int
    slurm_job_id: int
    pid: int
    comm: str

    @property
    def reason(self) -> str:
        return (f"xCUDA not loaded: process {self.pid} ({self.comm}) of Slurm job {self.slurm_job_id} runs without "
                f"{XCUDA_LIB} (LD_PRELOAD removed)")


def read_procs(proc_root: Path) -> dict[int, Proc]:
    """Every process of ``proc_root`` with its parent, state, age, name and CPU time (gone ones skipped)."""
    try:
        uptime_s = float((proc_root / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        uptime_s = float("inf")  # no uptime: every process counts as old
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in proc_root.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses; the fields follow the last ')'.
        close = stat.rfind(")")
        fields = stat[close + 2:].split()
        try:
            ppid, start_ticks = int(fields[1]), int(fields[19])
            cpu_ticks = int(fields[11]) + int(fields[12])  # utime + stime
        except (IndexError, ValueError):
            continue
        out[int(d.name)] = Proc(int(d.name), ppid, fields[0], uptime_s - start_ticks / hz,
                                stat[stat.find("(") + 1:close], cpu_ticks / hz)
    return out


def step_jobs(procs: dict[int, Proc], proc_root: Path) -> dict[int, int]:
    """pid → Slurm job for the processes under a root ``slurmstepd: [<job>.<step>]`` (the tree Slurm's
    ``proctrack/linuxproc`` follows), the step daemons themselves left out, and the extern step's (its ``sleep``
    holds the job's cgroup; what pam_slurm_adopt puts there is not in its tree anyway)."""
    roots: dict[int, int] = {}
    for pid, p in procs.items():
        if p.comm == SLURMSTEPD:
            title = stepd_title(pid, procs, proc_root)
            if title is not None and title[1] != "extern" and proc_uid(pid, proc_root) == 0:
                roots[pid] = title[0]
    if not roots:
        return {}
    memo: dict[int, int | None] = {}

    def find(pid: int) -> int | None:
        chain = []
        while pid in procs and pid not in memo and pid not in roots and len(chain) < 256:
            chain.append(pid)
            pid = procs[pid].ppid
        found = roots[pid] if pid in roots else memo.get(pid)
        for c in chain:
            memo[c] = found
        return found

    return {pid: j for pid in procs if pid not in roots and (j := find(pid)) is not None}


def job_of_processes(procs: dict[int, Proc], wanted: set[int], proc_root: Path) -> dict[int, int]:
    """pid → Slurm job id for the processes of the ``wanted`` jobs.

    A process under a job's root slurmstepd is that job's, whatever its environment says. Any other process (one
    that left the tree: a double fork to init) is the job of its ``SLURM_JOB_ID`` (else its nearest ancestor's),
    but only if it runs as the job's user — the uid of the job's processes under its slurmstepd — when that tree is
    seen here: ``SLURM_JOB_ID`` is the process's own to set, and a user must not pass his processes off as
    another user's job (to have it evicted, or to escape the check of his own)."""
    tree = step_jobs(procs, proc_root)
    users: dict[int, set[int]] = {}
    for pid, j in tree.items():
        if j in wanted:
            uid = proc_uid(pid, proc_root)
            if uid is not None and uid != 0:
                users.setdefault(j, set()).add(uid)
    own: dict[int, int | None] = {}

    def job(pid: int) -> int | None:
        chain = []
        while pid in procs and pid not in own:
            chain.append(pid)
            j = proc_slurm_job(pid, proc_root)
            if j is not None:
                own[pid] = j
                break
            pid = procs[pid].ppid
        found = own.get(pid)
        for p in chain:
            own.setdefault(p, found)
        return found

    out = {}
    for pid in procs:
        if pid in tree:
            j: int | None = tree[pid]
        else:
            j = job(pid)
            if j in users and proc_uid(pid, proc_root) not in users[j]:
                j = None  # claims a job that runs here as another user: not that job's
        if j in wanted:
            out[pid] = j
    return out


def user_pids_of_jobs(procs: dict[int, Proc], wanted: set[int], proc_root: Path) -> dict[int, set[int]]:
    """Slurm job id → its processes that run as its user (slurmstepd and anything else of root's left out), for
    the ``wanted`` jobs, in one walk of the process tree."""
    out: dict[int, set[int]] = {}
    for pid, j in job_of_processes(procs, wanted, proc_root).items():
        if j in wanted and proc_uid(pid, proc_root) not in (None, 0):
            out.setdefault(j, set()).add(pid)
    return out


def loads_xcuda(pid: int, proc_root: Path, lib: str = XCUDA_LIB) -> bool | None:
    """Whether the process maps ``lib`` (None: its maps cannot be read, or it has none: a zombie, a kernel thread)."""
    try:
        maps = (proc_root / str(pid) / "maps").read_text()
    except OSError:
        return None
    if not maps:
        return None
    return any(line.rsplit("/", 1)[-1] == lib for line in maps.splitlines() if "/" in line)


class XcudaCheck:
    """Which placed offline jobs have a process without xCUDA, from ``/proc`` (and NVML's GPU processes)."""

    def __init__(self, placements, gpu_indices: Iterable[int], gpu_pids: Callable[[], set[int]] | None = None,
                 proc_root: Path | str = "/proc", grace_s: float = 5.0, lib: str = XCUDA_LIB,
                 task_prolog: str | None = None, agent_pid: int | None = None):
        """``task_prolog``: the TaskProlog script Slurm runs (default: slurm.conf's ``TaskProlog=``; None found: a
        script named ``task_prolog.sh``). ``agent_pid``: the process whose Prolog runs count as slurmd's (default:
        this one, on the real ``/proc``)."""
        self.placements = placements
        self.gpu_indices = list(gpu_indices)
        self.gpu_pids = gpu_pids
        self.proc_root = Path(proc_root)
        self.grace_s = grace_s
        self.lib = lib
        self.task_prolog = task_prolog if task_prolog is not None else slurm_conf_task_prolog()
        self.agent_pid = agent_pid if agent_pid is not None else (
            os.getpid() if self.proc_root == Path("/proc") else None)
        self._unreadable: set[int] = set()

    def violations(self) -> list[Violation]:
        placed = {o.slurm_job_id: (i, o.job_id) for i in self.gpu_indices for o in self.placements.on_gpu(i)
                  if o.slurm_job_id is not None}
        if not placed:
            return []
        procs = read_procs(self.proc_root)
        on_gpu = self.gpu_pids() if self.gpu_pids is not None else None
        found: dict[int, Violation] = {}
        for pid, sid in sorted(job_of_processes(procs, set(placed), self.proc_root).items()):
            p = procs[pid]
            if sid in found or p.state in ("Z", "X") or p.age_s < self.grace_s:
                continue
            if on_gpu is not None and pid not in on_gpu:
                continue
            # the Prolog, TaskProlog, Epilog: not the job's code (a TaskProlog uses no GPU: on real GPUs, not exempt)
            if in_slurm_hook(pid, procs, self.proc_root, task_prolog=self.task_prolog, agent_pid=self.agent_pid,
                             task_prolog_exempt=on_gpu is None):
                continue
            ok = loads_xcuda(pid, self.proc_root, self.lib)
            if ok is None:
                if pid not in self._unreadable:
                    self._unreadable.add(pid)
                    log.warning("process %d of Slurm job %d: its memory maps cannot be read; xCUDA not checked", pid,
                                sid)
                continue
            if not ok:
                gpu_index, job_id = placed[sid]
                found[sid] = Violation(gpu_index, job_id, sid, pid, p.comm)
        self._unreadable &= set(procs)
        return list(found.values())


class XcudaWatch:
    """Runs an :class:`XcudaCheck` every ``interval_s`` on a thread and evicts each violating job once.

    ``evict(violation)`` does the eviction and records it (the agent's evictor and store sink);
    a job stays "already evicted" while the placements still show it (Slurm takes a moment to
    requeue it), and is checked again once it is placed anew.
    """

    def __init__(self, check: XcudaCheck, evict: Callable[[Violation], None], interval_s: float = 5.0):
        self.check = check
        self.evict = evict
        self.interval_s = interval_s
        self._evicted: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> list[Violation]:
        """One check; the violations acted on."""
        try:
            found = self.check.violations()
        except Exception:  # /proc or NVML briefly unreadable: next time
            log.exception("xCUDA check failed")
            return []
        placed = {o.slurm_job_id for i in self.check.gpu_indices for o in self.check.placements.on_gpu(i)}
        self._evicted &= placed
        acted = []
        for v in found:
            if v.slurm_job_id in self._evicted:
                continue
            log.warning("GPU %d: job %d — %s", v.gpu_index, v.job_id, v.reason)
            try:
                self.evict(v)
            except Exception:
                log.exception("eviction of job %d (Slurm job %d) failed", v.job_id, v.slurm_job_id)
                continue
            self._evicted.add(v.slurm_job_id)
            acted.append(v)
        return acted

    def start(self) -> XcudaWatch:
        self._thread = threading.Thread(target=self._run, name="node-agent-xcuda-check", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.once()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30.0)

