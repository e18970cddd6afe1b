"""A simulated GPU that follows what really runs on it (``muxflow node-agent --simulated``).

Each sample is the one simulated GPU model (``scheduler_core.interference.gpu_model``, the same the
simulated cluster and the trace-driven simulator use), driven by

- the **online replica's request rate**: scraped from its endpoint (``executors.node.scrape``)
  while that scrape is fresh — a real replica's real load; else the service's registered
  daily cycle (``qps_min``…``qps_max``, peak hour), as the simulated cluster models it;
  a GPU without an online service has no online load;
- the **offline jobs on the GPU, each at its share** (one, or several where the round split
  the GPU): what Slurm runs there (the plan in each job's comment) or what the latest round
  placed (``executors.node.placements``), with each job's interference traits from the
  catalog or its profile. A job runs kernels once it has run ``warmup_s`` (0 by default:
  Slurm's start is the real start);
- measurement noise of ``noise_pct`` on SM activity and utilization.

So a request burst on a real replica drives its simulated GPU's SM activity up, and
SysMonitor sees it on the next sample. The online split of every sample is the model's;
a replica without an endpoint also gets the model's request rate and latencies.

A simulated GPU has compute processes too (:func:`simulated_compute_pids`, what NVML's
``nvmlDeviceGetComputeRunningProcesses`` lists on a real one), from what really runs on the node:
the processes of the jobs placed on it, and any process whose ``CUDA_VISIBLE_DEVICES`` names it
first — the device a CUDA program uses by default, which the TaskProlog's plan sets. So the xCUDA
check (:mod:`executors.node.xcuda_check`) judges the same processes on the dev cluster as on real
GPUs, a process that left its job's tree included. (A process that clears ``CUDA_VISIBLE_DEVICES``
too is on no simulated GPU; on a real one NVML still lists it on the GPU it uses.)
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from executors.node.attribution import proc_env
from executors.node.placements import Placements
from executors.node.sampler import NAN, RawSample
from scheduler_core.domain import GpuTypeSpec
from scheduler_core.guard.burst import BURST_TARGET_UTIL
from scheduler_core.interference.gpu_model import (
    XCUDA_TARGET_UTIL,
    OnlineModel,
    clock_frac,
    on_one_gpu,
    online_alone,
)
from scheduler_core.interference.pairs import InterferenceParams
from scheduler_core.online.load import diurnal_qps

log = logging.getLogger(__name__)

OCCUPANCY_PER_SM = 0.55  # SM occupancy over SM activity, as the simulated cluster reports it


@dataclass(frozen=True)
class Replica:
    """The online service replica on one GPU, as registered in the store."""

    service: str
    family: str
    mem_bytes: float
    qps_min: float
    qps_max: float
    peak_hour_utc: float
    metrics_url: str | None = None
    latency_slo_ms: float | None = None  # the service's p99 SLO (the burst guard's condition)
    run_as_user: str | None = None  # the user its processes run as (None: not registered)


class SimulatedGpu:
    """``f(now_s) -> RawSample`` for one GPU of the node (see the module docstring)."""

    def __init__(self, gpu_index: int, spec: GpuTypeSpec, online: OnlineModel | None, replica: Replica | None,
                 placements: Placements, scraped_qps: Callable[[float], float | None] | None = None, *,
                 interference: InterferenceParams = InterferenceParams(), noise_pct: float = 1.0,
                 warmup_s: float = 0.0, seed: int = 0, xcuda_target_util: float | None = XCUDA_TARGET_UTIL,
                 mps_split_gaps: bool = False):
        self.gpu_index = gpu_index
        # As NVML under MPS on a real GPU: no per-process split (the online utilization, SM activity and
        # memory bandwidth) while an offline job is on the GPU; False: the model's split always.
        self.mps_split_gaps = mps_split_gaps
        # The job's xCUDA paces it to this GPU load (gpu_model.xcuda_pace); None: unpaced.
        self.xcuda_target_util = xcuda_target_util
        # The node agent's burst guard lowered xCUDA's target on this GPU (scheduler_core.guard.burst): the jobs'
        # xCUDA, reading the agent's record, paces them to its floor.
        self.burst = False
        self.spec = spec
        self.online = online
        self.replica = replica
        self.placements = placements
        self.scraped_qps = scraped_qps
        self.interference = interference
        self.noise_pct = noise_pct
        self.warmup_s = warmup_s
        self._rng = np.random.default_rng([seed, gpu_index])
        self._untraited: set[int] = set()
        self._key: tuple | None = None
        self._state: tuple = ()
        self.qps_source = "none"   # 'endpoint' | 'daily cycle' | 'none': what drove the last sample

    def _qps(self, now_s: float) -> float:
        if self.replica is None:
            self.qps_source = "none"
            return 0.0
        if self.scraped_qps is not None:
            q = self.scraped_qps(now_s)
            if q is not None:
                self.qps_source = "endpoint"
                return q
        self.qps_source = "daily cycle"
        t = dt.datetime.fromtimestamp(math.floor(now_s), tz=dt.UTC)  # the cycle moves by the second
        r = self.replica
        return float(diurnal_qps(t.hour + t.minute / 60.0 + t.second / 3600.0, r.qps_min, r.qps_max, r.peak_hour_utc))

    def __call__(self, now_s: float) -> RawSample:
        qps = self._qps(now_s)
        jobs = self.placements.on_gpu(self.gpu_index)
        for j in jobs:
            if j.traits is None and j.job_id not in self._untraited:
                self._untraited.add(j.job_id)
                log.warning("GPU %d: job %d has no traits (no profile, unknown type): not simulated",
                            self.gpu_index, j.job_id)
        running = tuple(
            (j.traits, j.sm_pct, float(j.mem_bytes),
             # no kernels of its own while it starts
             1.0 if j.started_epoch_s is None or now_s - j.started_epoch_s >= self.warmup_s else 0.0)
            for j in sorted(jobs, key=lambda j: j.job_id) if j.traits is not None)
        # The model's inputs change once a second or a scrape at most; samples come every few ms.
        key = (qps, running, self.burst)
        if key != self._key:
            self._key, self._state = key, self._evaluate(qps, running)
        util, sm, mem, bw, online = self._state
        if self.noise_pct > 0:
            sm = min(100.0, max(0.0, sm + self.noise_pct * float(self._rng.standard_normal())))
            util = min(100.0, max(0.0, util + self.noise_pct * float(self._rng.standard_normal())))
        clock = float(clock_frac(sm, self.spec.clock_drop_frac)) * self.spec.max_sm_clock_mhz
        return RawSample(util, sm, sm * OCCUPANCY_PER_SM, mem, float(self.spec.memory_bytes), bw, clock,
                         float(self.spec.max_sm_clock_mhz), NAN, NAN, False, *online)

    def set_burst(self, on: bool) -> None:
        """The agent's burst guard began (True) or ended (False) on this GPU."""
        self.burst = bool(on)

    def _evaluate(self, qps: float, running: tuple) -> tuple:
        """(util, SM, memory, bandwidth, the 7 online fields) of the model, without measurement noise.

        ``running``: (traits, share, memory, duty) of each offline job on the GPU."""
        model = self.online if self.online is not None else _NO_ONLINE
        on = online_alone(model, qps)
        traits, pct, mem, duty = zip(*running) if running else ((), (), (), ())
        target = self.xcuda_target_util
        if self.burst and target is not None:
            target = BURST_TARGET_UTIL
        shared, _ = on_one_gpu(on, model, traits, pct, duty, mem, self.interference, target)
        if self.replica is None or self.online is None:
            online = (NAN,) * 7
        else:
            endpoint = self.replica.metrics_url is not None
            lat = float(on.latency_ms)
            split = not (running and self.mps_split_gaps)
            online = (float(on.util_pct) if split else NAN, float(on.sm_pct) if split else NAN, float(on.mem_bytes),
                      float(on.bw_pct) if split else NAN,
                      NAN if endpoint else float(qps), NAN if endpoint else lat * float(shared.slowdown),
                      NAN if endpoint else lat)
        return (float(shared.util_pct), float(shared.sm_pct), float(shared.mem_bytes), float(shared.bw_pct), online)

    def online_gap(self) -> str | None:
        if self.replica is None:
            return "no online service on this GPU"
        if self.mps_split_gaps and self.placements.on_gpu(self.gpu_index):
            return "GPU split: NVML reports every MPS client's kernels as the MPS server's (simulated, as under MPS)"
        return None


# A GPU without an online service: an "online side" that never loads it (only the offline job runs).
_NO_ONLINE = OnlineModel(capacity_qps=1.0, util_at_peak_pct=0.0, sm_need=0.0, mem_bw=0.0, base_latency_ms=0.0,
                         mem_bytes=0.0, sensitivity=0.0, pressure=0.0)


def simulated_compute_pids(procs: Mapping[int, object], proc_root: Path, gpu_indices: Iterable[int],
                           jobs_on: Mapping[int, set[int | None]], job_of: Mapping[int, int],
                           node: str | None = None) -> dict[int, set[int]]:
    """GPU index → the processes with a context on that simulated GPU: each process of a Slurm job placed on it
    (``jobs_on``: GPU → its placed Slurm jobs; ``job_of``: pid → Slurm job, as the xCUDA check attributes them),
    and each process whose ``CUDA_VISIBLE_DEVICES`` begins with the GPU's index and, where ``node`` is given, whose
    ``SLURMD_NODENAME`` is that node. Zombies hold no context.

    The node's name matters where several simulated nodes share one host (the dev cluster): a process of another
    node's job, or one outside Slurm altogether (a test harness, a program of the machine's that happens to set
    ``CUDA_VISIBLE_DEVICES``), is on none of this node's GPUs. A process that clears ``SLURMD_NODENAME`` too leaves
    this model's view (NVML on a real GPU lists every context, whatever its environment)."""
    indices = set(gpu_indices)
    out: dict[int, set[int]] = {i: set() for i in indices}
    for pid, p in procs.items():
        if getattr(p, "state", "") in ("Z", "X"):
            continue
        sid = job_of.get(pid)
        for i in indices:
            if sid is not None and sid in jobs_on.get(i, ()):
                out[i].add(pid)
        env = proc_env(pid, proc_root, "CUDA_VISIBLE_DEVICES", "SLURMD_NODENAME")
        if node is not None and env.get("SLURMD_NODENAME") != node:
            continue
        first = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
        if first.strip().isdigit() and int(first) in indices:
            out[int(first)].add(pid)
    return out
