"""The online replica's share of a real GPU, from NVML's per-process accounting (DESIGN §5: online solo features).

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
    """Those of ``keys`` set in a process's environment (empty: none, or the process is gone or unreadable)."""
    try:
        env = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    want = tuple(k.encode() + b"=" for k in keys)
    return {k.decode(): v.decode(errors="replace")
            for k, _, v in (item.partition(b"=") for item in env.split(b"\0") if item.startswith(want))}


# SLURM_SCRIPT_CONTEXT of slurmd's own hooks. (A job's tasks carry "prolog_task" on Slurm 22.05: the TaskProlog's
# context leaks into the task environment, so it does not tell a TaskProlog from the job.)
SLURMD_HOOKS = ("prolog_slurmd", "epilog_slurmd")
TASK_PROLOG_NAME = "task_prolog.sh"
TASK_PROLOG_MAX_S = 60.0  # a TaskProlog waits at most 30 s for its plan; older, a process so named is judged


def in_slurm_hook(pid: int, procs, proc_root: Path, task_prolog_name: str = TASK_PROLOG_NAME) -> bool:
    """Whether the process is one of Slurm's own hooks for a job, or a child of one: the Prolog or the Epilog
    (slurmd marks their environment ``SLURM_SCRIPT_CONTEXT=prolog_slurmd|epilog_slurmd``) or the TaskProlog
    (the process named like the TaskProlog script, younger than :data:`TASK_PROLOG_MAX_S`: its name is all that
    tells it from the job's tasks, so the exemption is bounded in time)."""
    name = task_prolog_name[:15]  # /proc cuts names to 15 bytes
    seen = 0
    while pid in procs and seen < 64:
        p = procs[pid]
        if p.comm == name and p.age_s < TASK_PROLOG_MAX_S:
            return True
        if proc_env(pid, proc_root, "SLURM_SCRIPT_CONTEXT").get("SLURM_SCRIPT_CONTEXT") in SLURMD_HOOKS:
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
