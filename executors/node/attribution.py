"""The online replica's share of a real GPU, from NVML's per-process accounting.

Its solo features are what the round's online side needs (docs/DESIGN.md §5).

The node agent measures device totals every sample; what the round needs is the online
service's own load. Every ``refresh_s`` per GPU (not every 10 ms sample) it reads:

- ``nvmlDeviceGetComputeRunningProcesses``: the processes with a context on the GPU and
  their memory (``usedGpuMemory``; None where the driver cannot say);
- ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)``: one sample per process
  that used the GPU in each driver sampling period since the last read (SM and
  memory-controller utilization); ``NVML_ERROR_NOT_FOUND`` when no process did, which is a
  measured idle, not a failure.

A process belongs to the offline side when its ``SLURM_JOB_ID`` (``/proc/<pid>/environ``)
is one of the offline Slurm jobs placed on that GPU (``executors.node.placements``);
everything else on the GPU — the replica, its helpers — is the online side. Then

- online utilization and SM activity = device value × online share of the SM samples;
- online memory bandwidth = device value × online share of the memory-controller samples;
- online memory = device memory used − the offline processes' memory.

Where the driver cannot split (per-process utilization not supported, an offline process
whose memory is unknown, or MPS: NVML then reports the kernels of every client under the
MPS server process) the affected columns are NaN and :meth:`gap` says why; a GPU with no
offline process needs no split (everything on it is online).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

NAN = float("nan")
MPS_SERVER = "nvidia-cuda-mps-server"


@dataclass(frozen=True)
class Split:
    util_share: float | None      # online share of SM time
    bw_share: float | None        # online share of memory-controller time
    offline_mem_bytes: float | None
    reason: str | None = None


def proc_slurm_job(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The ``SLURM_JOB_ID`` in a process's environment (None: none, or the process is gone)."""
    try:
        return int(proc_env(pid, proc_root, "SLURM_JOB_ID")["SLURM_JOB_ID"])
    except (KeyError, ValueError):
        return None


def proc_env(pid: int, proc_root: Path, *keys: str) -> dict[str, str]:
    """Those of ``keys`` set in a process's environment (empty: none, or the process is gone or unreadable, or its
    environment is over :data:`ENVIRON_MAX_BYTES`: a cut one is unknown, so that what lies past the cut — or a key
    the cut split — never counts; every caller then trusts the process less, never more)."""
    env = read_bounded(proc_root / str(pid) / "environ", ENVIRON_MAX_BYTES)
    if env is None:
        return {}
    want = tuple(k.encode() + b"=" for k in keys)
    return {k.decode(): v.decode(errors="replace")
            for k, _, v in (item.partition(b"=") for item in env.split(b"\0") if item.startswith(want))}


# What the agent reads of another user's process, at most: the process's own to make as large as it likes (an
# environment or argv up to the kernel's 2 MiB of exec arguments, and it can grow them later), read every few
# seconds for every process of the node. Slurm's and MuxFlow's own values fit many times over.
ENVIRON_MAX_BYTES = 64 << 10
CMDLINE_MAX_BYTES = 64 << 10


def read_bounded(path: Path, max_bytes: int) -> bytes | None:
    """The file's bytes if it holds at most ``max_bytes``; None when it is longer (cut: unknown), gone or
    unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError:
        return None
    return None if len(data) > max_bytes else data


# SLURM_SCRIPT_CONTEXT of slurmd's own hooks. (A job's tasks carry "prolog_task" on Slurm 22.05: the TaskProlog's
# context leaks into the task environment, so it does not tell a TaskProlog from the job.) Any process can put
# either value in its own environment: it counts only for a process that provably is slurmd's hook
# (:func:`is_slurmd_hook`).
SLURMD_HOOKS = ("prolog_slurmd", "epilog_slurmd")
TASK_PROLOG_NAME = "task_prolog.sh"
TASK_PROLOG_MAX_S = 60.0  # a TaskProlog waits at most 30 s for its plan; older, even Slurm's own is judged
SLURMD = "slurmd"
SLURMSTEPD = "slurmstepd"
# slurmstepd's process title (setproctitle; Slurm 22.05 and later): "slurmstepd: [<job id>.<step>]", the step being
# batch, extern, interactive or a number. The title is what /proc/<pid>/cmdline shows (NUL-padded).
_STEPD_TITLE = re.compile(r"slurmstepd: \[(\d+)\.([0-9A-Za-z_]+)\]")


def proc_ids(pid: int, proc_root: Path, which: str = "Uid") -> tuple[int, int, int, int] | None:
    """A process's real, effective, saved and filesystem uid (``which="Gid"``: gid), as the kernel reports them in
    ``/proc/<pid>/status`` (None: gone or unreadable).

    Not the owner of ``/proc/<pid>``: a process that calls ``prctl(PR_SET_DUMPABLE, 0)`` (or any process between a
    setuid and its next exec) has its ``/proc/<pid>`` owned by root."""
    try:
        text = (proc_root / str(pid) / "status").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(which + ":"):
            try:
                ids = tuple(int(x) for x in line.split()[1:5])
            except ValueError:
                return None
            return ids if len(ids) == 4 else None  # type: ignore[return-value]
    return None


def proc_uid(pid: int, proc_root: Path) -> int | None:
    """The process's uid when its four uids (real, effective, saved, filesystem) agree; None otherwise (a process
    between identities is nobody's), or when it is gone."""
    ids = proc_ids(pid, proc_root)
    return ids[0] if ids is not None and len(set(ids)) == 1 else None


def proc_cmdline(pid: int, proc_root: Path) -> tuple[str, ...] | None:
    """``/proc/<pid>/cmdline`` split on NULs, trailing empty ones (setproctitle's padding) dropped; None when gone,
    or when it is over :data:`CMDLINE_MAX_BYTES` (cut: unknown, as a cut environment).

    A process can rewrite its own (as it can its ``comm``): it proves nothing alone, only with a trusted parent."""
    raw = read_bounded(proc_root / str(pid) / "cmdline", CMDLINE_MAX_BYTES)
    if raw is None:
        return None
    args = raw.decode(errors="replace").split("\0")
    while args and args[-1] == "":
        args.pop()
    return tuple(args)


def stepd_title(pid: int, procs, proc_root: Path) -> tuple[int, str] | None:
    """(job id, step) of a process named ``slurmstepd`` whose title is ``slurmstepd: [<job>.<step>]``, else None.
    Only trusted together with the process's uid: a user's process can take the name and the title."""
    p = procs.get(pid)
    if p is None or p.comm != SLURMSTEPD:
        return None
    argv = proc_cmdline(pid, proc_root)
    m = _STEPD_TITLE.fullmatch(argv[0].strip()) if argv else None
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass(frozen=True)
class TaskPrologOf:
    """What a genuine TaskProlog process proves: its job (slurmstepd's title, checked against its SLURM_JOB_ID) and
    its user (the kernel's uid and gid)."""

    slurm_job_id: int
    step: str
    uid: int
    gid: int | None


def _script_argv(script: str) -> tuple[str, ...] | None:
    """The argv the kernel gives a process that execs ``script``: its shebang's interpreter (and its one optional
    argument) then the script; None when the script cannot be read here."""
    try:
        with open(script, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return (script,)
    interp, _, arg = first[2:].decode(errors="replace").strip().partition(" ")
    arg = arg.strip()
    return (interp, arg, script) if arg else (interp, script)


def _argv_forms(script: str) -> tuple[tuple[str, ...], ...] | None:
    want = _script_argv(script)
    if want is None or len(want) != 3 or want[0].rsplit("/", 1)[-1] != "env":
        return None if want is None else (want,)
    return want, (want[1], script)  # "#!/usr/bin/env bash": env execs bash, whose argv is then (bash, script)


def runs_script(argv: tuple[str, ...] | None, script: str | None, name: str = TASK_PROLOG_NAME) -> bool:
    """Whether a process's argv is that of an exec of ``script`` with no arguments (Slurm runs its hooks so): the
    script's shebang interpreter and the script, or (the script unreadable here) at most an interpreter and one
    option before it. Without a configured script, the last word must be a script named ``name``."""
    if not argv or len(argv) > 3:
        return False
    if script is None:
        return argv[-1].rsplit("/", 1)[-1] == name
    forms = _argv_forms(script)
    if forms is not None:
        return argv in forms
    return argv[-1] == script


def task_prolog_of(pid: int, procs, proc_root: Path, script: str | None = None,
                   name: str = TASK_PROLOG_NAME) -> TaskPrologOf | None:
    """The job and user of ``pid`` if it provably is Slurm's TaskProlog for a job, else None.

    Slurm 22.05 (seen on the dev cluster; docs/NODE_AGENT.md "What the agent trusts"): the step's root ``slurmstepd:
    [<job>.<step>]`` forks one process per task, which takes the job user's identity (same name and title) and runs
    the TaskProlog (``/bin/bash <TaskProlog>``) before it execs the task. So a genuine TaskProlog

    - is named like the script and runs exactly the configured script (argv);
    - has four equal uids (kernel-reported) and, in its environment, the job id of slurmstepd's title;
    - has as parent a ``slurmstepd`` titled for that job: root's, or one of the job user's (same uid) whose own
      parent is the root ``slurmstepd`` of the same job and step.

    A user cannot make a root-owned process the parent of his own, nor put his processes under another job's
    slurmstepd: whatever he forges (name, argv, environment, a ``slurmstepd``-named process of his own) proves at
    most his own job, under its own steps, with his own uid."""
    p = procs.get(pid)
    if p is None or p.comm != name[:15] or not runs_script(proc_cmdline(pid, proc_root), script, name):
        return None
    uid = proc_uid(pid, proc_root)
    if uid is None:
        return None
    parent = stepd_title(p.ppid, procs, proc_root)
    if parent is None:
        return None
    parent_uid = proc_uid(p.ppid, proc_root)
    if parent_uid != 0:
        grand = procs[p.ppid].ppid
        if parent_uid != uid or stepd_title(grand, procs, proc_root) != parent or proc_uid(grand, proc_root) != 0:
            return None
    job = proc_env(pid, proc_root, "SLURM_JOB_ID").get("SLURM_JOB_ID")
    if job != str(parent[0]):
        return None
    gids = proc_ids(pid, proc_root, "Gid")
    return TaskPrologOf(parent[0], parent[1], uid, gids[0] if gids is not None else None)


def slurm_conf_task_prolog(slurm_conf: str | os.PathLike[str] | None = None) -> str | None:
    """``TaskProlog=`` of slurm.conf (``slurm_conf``, else ``$SLURM_CONF``, else ``/etc/slurm/slurm.conf``); None when
    the file cannot be read or sets none."""
    path = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    found = None
    for line in text.splitlines():
        m = re.match(r"\s*TaskProlog\s*=\s*(\S+)", line.split("#", 1)[0], flags=re.IGNORECASE)
        if m:
            found = m.group(1).strip("\"'")
    return found


def default_task_prolog(prolog: Path | str | None, slurm_conf: str | None = None) -> str | None:
    """The TaskProlog Slurm runs: slurm.conf's ``TaskProlog=``, else ``task_prolog.sh`` beside the Prolog, else None."""
    return slurm_conf_task_prolog(slurm_conf) or (str(Path(prolog).with_name(TASK_PROLOG_NAME)) if prolog else None)


def is_slurmd_hook(pid: int, procs, proc_root: Path, agent_pid: int | None = None) -> bool:
    """Whether ``pid`` is slurmd's Prolog or Epilog (or the Prolog the node agent itself runs for a job slurmd
    skipped, :mod:`executors.node.prolog_watch`): ``SLURM_SCRIPT_CONTEXT=prolog_slurmd|epilog_slurmd`` in its
    environment *and* root's process (four uids 0) *and* a child of root's ``slurmd`` or ``slurmstepd`` (or of the
    agent, ``agent_pid``, as the agent's uid). A process of the job's user is never the Prolog."""
    if proc_env(pid, proc_root, "SLURM_SCRIPT_CONTEXT").get("SLURM_SCRIPT_CONTEXT") not in SLURMD_HOOKS:
        return False
    p = procs.get(pid)
    if p is None:
        return False
    uid = proc_uid(pid, proc_root)
    if agent_pid is not None and p.ppid == agent_pid:
        return uid is not None and uid in (0, os.geteuid())
    parent = procs.get(p.ppid)
    return (uid == 0 and parent is not None and parent.comm in (SLURMD, SLURMSTEPD)
            and proc_uid(p.ppid, proc_root) == 0)


def in_slurm_hook(pid: int, procs, proc_root: Path, task_prolog_name: str = TASK_PROLOG_NAME, *,
                  task_prolog: str | None = None, agent_pid: int | None = None,
                  task_prolog_exempt: bool = True) -> bool:
    """Whether the process is one of Slurm's own hooks for a job, or a child of one: the Prolog or the Epilog
    (:func:`is_slurmd_hook`: root's, a child of slurmd, marked ``SLURM_SCRIPT_CONTEXT``) or the TaskProlog
    (:func:`task_prolog_of`: under the job's slurmstepd, running the configured script ``task_prolog``), the latter
    younger than :data:`TASK_PROLOG_MAX_S` (it runs with the job's environment, PATH included: the exemption is
    bounded in time), as is the job user's ``slurmstepd`` fork that runs it. ``task_prolog_exempt=False``: neither
    is ever exempt (they use no GPU)."""
    name = task_prolog_name[:15]  # /proc cuts names to 15 bytes
    first = procs.get(pid)
    # The job user's fork of the step's slurmstepd, which runs the TaskProlog before it execs the task: Slurm's
    # code (its name and title are the user's to take, so for the TaskProlog's minute at most).
    if (task_prolog_exempt and first is not None and first.comm == SLURMSTEPD and first.age_s < TASK_PROLOG_MAX_S
            and (title := stepd_title(pid, procs, proc_root)) is not None
            and stepd_title(first.ppid, procs, proc_root) == title and proc_uid(first.ppid, proc_root) == 0):
        return True
    seen = 0
    while pid in procs and seen < 64:
        p = procs[pid]
        if (task_prolog_exempt and p.comm == name and p.age_s < TASK_PROLOG_MAX_S
                and task_prolog_of(pid, procs, proc_root, task_prolog, task_prolog_name) is not None):
            return True
        if is_slurmd_hook(pid, procs, proc_root, agent_pid):
            return True
        pid, seen = p.ppid, seen + 1  # up to slurmstepd and init: a job's tasks descend from no hook
    return False


def proc_name(pid: int, proc_root: Path = Path("/proc")) -> str:
    try:
        return (proc_root / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


class ProcessAttribution:
    """Per GPU, the online/offline split, refreshed at most every ``refresh_s`` (agent clock)."""

    def __init__(self, nvml, offline_slurm_jobs: Callable[[int], set[int]], refresh_s: float = 1.0,
                 proc_root: Path | str = "/proc"):
        self.nv = nvml
        self.offline_slurm_jobs = offline_slurm_jobs
        self.refresh_s = refresh_s
        self.proc_root = Path(proc_root)
        self._last_ts: dict[int, int] = {}
        self._split: dict[int, Split] = {}
        self._at: dict[int, float] = {}
        self._job_of: dict[int, int | None] = {}

    def _job(self, pid: int) -> int | None:
        if pid not in self._job_of:
            self._job_of[pid] = proc_slurm_job(pid, self.proc_root)
        return self._job_of[pid]

    def read(self, gpu_index: int, handle) -> Split:
        """One split from NVML now (updates the last-seen timestamp)."""
        nv = self.nv
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception as exc:
            return Split(None, None, None, f"GPU split: running processes unavailable ({_err(exc)})")
        live = {p.pid for p in procs}
        for pid in [p for p in self._job_of if p not in live]:
            del self._job_of[pid]  # a PID may be reused by another process later
        offline_jobs = self.offline_slurm_jobs(gpu_index)
        offline = {p.pid for p in procs if offline_jobs and self._job(p.pid) in offline_jobs}
        reasons = []
        if not offline:
            off_mem: float | None = 0.0
        elif any(p.usedGpuMemory is None for p in procs if p.pid in offline):
            off_mem = None
            reasons.append("online memory: the driver gives no per-process memory")
        else:
            off_mem = float(sum(p.usedGpuMemory for p in procs if p.pid in offline))
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, self._last_ts.get(gpu_index, 0))
        except nv.NVMLError_NotFound:
            samples = []  # no process used the GPU since the last read
        except Exception as exc:
            if not offline:  # nothing to split: the whole GPU is the online side
                return Split(1.0, 1.0, off_mem, "; ".join(reasons) or None)
            reasons.append(f"GPU split: no per-process utilization ({_err(exc)})")
            return Split(None, None, off_mem, "; ".join(reasons))
        if samples:
            self._last_ts[gpu_index] = max(int(s.timeStamp) for s in samples)
        if offline and any(proc_name(s.pid, self.proc_root) == MPS_SERVER for s in samples):
            reasons.append("GPU split: under MPS NVML reports every client's kernels as the MPS server's")
            return Split(None, None, off_mem, "; ".join(reasons))
        sm_all = sum(float(s.smUtil) for s in samples)
        mem_all = sum(float(s.memUtil) for s in samples)
        sm_on = sum(float(s.smUtil) for s in samples if s.pid not in offline)
        mem_on = sum(float(s.memUtil) for s in samples if s.pid not in offline)
        # No sample at all: no process ran kernels; the (idle) device value is the online side's.
        return Split(sm_on / sm_all if sm_all > 0 else 1.0, mem_on / mem_all if mem_all > 0 else 1.0, off_mem,
                     "; ".join(reasons) or None)

    def online(self, gpu_index: int, handle, now_s: float, gpu_util_pct: float, sm_pct: float,
               mem_used_bytes: float, bw_pct: float) -> tuple[float, float, float, float]:
        """(util %, SM activity %, memory bytes, bandwidth %) of the online side; NaN where unknown."""
        at = self._at.get(gpu_index)
        if at is None or now_s - at >= self.refresh_s or now_s < at:
            split = self.read(gpu_index, handle)
            if split.reason != getattr(self._split.get(gpu_index), "reason", None) and split.reason:
                log.warning("GPU %d: %s", gpu_index, split.reason)
            self._split[gpu_index], self._at[gpu_index] = split, now_s
        sp = self._split[gpu_index]
        u = NAN if sp.util_share is None else gpu_util_pct * sp.util_share
        sm = NAN if sp.util_share is None else sm_pct * sp.util_share
        mem = NAN if sp.offline_mem_bytes is None or math.isnan(mem_used_bytes) else \
            max(0.0, mem_used_bytes - sp.offline_mem_bytes)
        bw = NAN if sp.bw_share is None else bw_pct * sp.bw_share
        return u, sm, mem, bw

    def gap(self, gpu_index: int) -> str | None:
        sp = self._split.get(gpu_index)
        return None if sp is None else sp.reason


def _err(exc: Exception) -> str:
    return f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__
