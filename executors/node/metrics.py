"""The node agent's Prometheus endpoint: per GPU, per offline job and per online replica (docs/OBSERVABILITY.md).

Everything is read at scrape time from what the agent already holds (the latest sample in each GPU's ring, its
SysMonitor, the placements it polls, the minute it last flushed), so publishing costs the sampling loop nothing:
a scrape copies a few numbers under no lock (each read is of one attribute, written whole by the sampling thread).

- **GPU series** keep dcgm-exporter's names and labels where they mean the same (``DCGM_FI_DEV_GPU_UTIL``,
  ``DCGM_FI_PROF_SM_ACTIVE`` …, labels ``gpu``, ``UUID``, ``modelName``, ``Hostname``), so existing dashboards
  work; MuxFlow adds ``source`` (``nvml`` or ``simulated``: a simulated GPU's figures are the model's, never to be
  read as measured). What dcgm-exporter has no name for is ``muxflow_gpu_*``.
- **Job series** (``muxflow_job_*``) carry ``node``, ``gpu``, ``gpu_uuid``, ``hpc_job`` (the Slurm job id, as
  dcgm-exporter's HPC job mapping names it; empty on the simulated cluster), ``job_id`` (the feature store's id;
  not ``job``, which Prometheus gives the scrape job),
  ``user`` and ``job_type``.
- **Service series** (``muxflow_service_*``) carry ``service``, ``node``, ``gpu``: the replica's last whole
  minute as the agent recorded it (request rate, average and p99 latency, slowdown against its solo latency),
  its allowance and SLO from the store, and the time (whole minutes) it spent over its allowance or its SLO.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduler_core.domain import GpuHealth

log = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuMeta:
    """What the labels of one GPU say: its index on the node, the store's id, UUID and type."""

    gpu_index: int
    gpu_id: int
    uuid: str
    gpu_type: str


@dataclass(frozen=True)
class ServiceMeta:
    """The online service of a replica: its SLO and slowdown allowance (from the store)."""

    name: str
    latency_slo_ms: float
    slowdown_allowance: float


@dataclass(frozen=True)
class JobMeta:
    """Who an offline job is: its owner and its type label (``""``: none given)."""

    user: str
    job_type: str


def _finite(v: Any, per: float = 1.0) -> float | None:
    """``v / per`` when ``v`` is a finite number, else None (NaN: not available; no series, never a made-up 0)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f / per if math.isfinite(f) else None


class NodeAgentCollector:
    """A ``prometheus_client`` collector over a running :class:`executors.node.agent.NodeAgent`."""

    def __init__(self, agent: Any, node: str, gpus: Iterable[GpuMeta], services: dict[int, ServiceMeta] | None = None,
                 jobs: Callable[[int], JobMeta | None] = lambda _job_id: None,
                 xcuda: Callable[[list[tuple[int, str]]], dict[int, list[Any]]] = lambda _jobs: {}):
        self.agent = agent
        self.xcuda = xcuda   # [(Slurm job id, user)] → its live processes' xCUDA counters (executors.node.xcuda.stats)
        self.node = node
        self.gpus = {g.gpu_index: g for g in gpus}
        self.services = dict(services or {})     # GPU index → the service of its replica
        self.jobs = jobs
        self._over: dict[int, int] = dict.fromkeys(self.services, 0)   # minutes over the allowance, per GPU
        self._over_slo: dict[int, int] = dict.fromkeys(self.services, 0)
        for idx in self.services:
            loop = agent.loops.get(idx)
            if loop is not None:
                loop.minute_listeners.append(lambda row, i=idx: self._count_minute(i, row))

    def _count_minute(self, idx: int, row: Any) -> None:
        """A whole minute of the replica on GPU ``idx`` (the sampling thread calls it): over its allowance, its SLO?"""
        service = self.services[idx]
        lat = _finite(getattr(row, "online_latency_ms", None))
        p99 = _finite(getattr(row, "online_latency_p99_ms", None))
        sd = slowdown(lat, _finite(getattr(row, "online_solo_latency_ms", None)))
        if sd is not None and sd > service.slowdown_allowance + 1e-9:
            self._over[idx] += 1
        worst = p99 if p99 is not None else lat
        if worst is not None and worst > service.latency_slo_ms:
            self._over_slo[idx] += 1

    # prometheus_client calls this on every scrape
    def collect(self) -> Iterable[Any]:
        source = str(getattr(self.agent.sampler, "source", "nvml"))
        gpu_labels = ["gpu", "UUID", "modelName", "Hostname", "source"]
        g = {name: GaugeMetricFamily(name, doc, labels=gpu_labels, unit="") for name, doc in (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
            ("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles at least one warp was active on an SM (0-1; NVML "
                                       "utilization where the GPU has no GPM)."),
            ("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of resident warps to the SMs' maximum (0-1; GPM only)."),
            ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory controller utilization (in %)."),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
            ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
            ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
            ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
        )}
        m_labels = ["node", "gpu", "gpu_uuid", "gpu_type", "source"]
        health = GaugeMetricFamily("muxflow_gpu_health", "SysMonitor state of the GPU: 1 for the state it is in.",
                                   labels=m_labels + ["state"])
        burst = GaugeMetricFamily("muxflow_gpu_burst_guard",
                                  "1 while the GPU's online replica is in a burst and the agent holds its offline work "
                                  "at xCUDA's floor, else 0 (absent where the guard is off).", labels=m_labels)
        last = GaugeMetricFamily("muxflow_gpu_last_sample_timestamp_seconds",
                                 "When the agent last read the GPU (Unix time, agent clock).", labels=m_labels)
        gpu_counters = {name: CounterMetricFamily(name, doc, labels=m_labels) for name, doc in (
            ("muxflow_gpu_xid_errors", "XID events the driver reported for the GPU."),
            ("muxflow_gpu_evictions", "Evictions of offline work from the GPU (Overlimit, device errors)."),
            ("muxflow_gpu_samples", "Samples read from the GPU."),
            ("muxflow_gpu_sample_gaps", "Ticks with no reading of the GPU."),
        )}
        job_labels = ["node", "gpu", "gpu_uuid", "hpc_job", "job_id", "user", "job_type"]
        share = GaugeMetricFamily("muxflow_job_sm_share_ratio", "The job's planned MPS share of the GPU's SMs (0-1).",
                                  labels=job_labels)
        quota = GaugeMetricFamily("muxflow_job_memory_quota_bytes", "The job's GPU memory quota (xCUDA).",
                                  labels=job_labels)
        xc = {name: (CounterMetricFamily if kind == "c" else GaugeMetricFamily)(name, doc, labels=job_labels)
              for name, kind, doc in (
            ("muxflow_job_memory_charged_bytes", "g", "GPU memory charged to the job's quota now (xCUDA, summed over "
                                                      "its processes)."),
            ("muxflow_job_xcuda_launches", "c", "Kernel launches through xCUDA's gate (the job's live processes)."),
            ("muxflow_job_xcuda_waits", "c", "Launches that waited at xCUDA's gate (paced)."),
            ("muxflow_job_xcuda_wait_seconds", "c", "Time launches waited at xCUDA's gate."),
            ("muxflow_job_xcuda_launch_rate_limit", "g", "The launch rate xCUDA paces the job to, launches/s (absent "
                                                         "while its gate is open)."),
            ("muxflow_job_xcuda_fallback", "g", "1 while xCUDA paces at its fixed safe rate: no usable GPU record "
                                                "from the node agent."),
            ("muxflow_job_xcuda_processes", "g", "The job's processes publishing xCUDA counters."),
        )}
        job_evictions = CounterMetricFamily("muxflow_job_evictions",
                                            "Times this agent evicted the job (requeued it) from a GPU of the node.",
                                            labels=["node", "hpc_job", "job_id"])
        svc_labels = ["service", "node", "gpu"]
        svc = {name: GaugeMetricFamily(name, doc, labels=svc_labels) for name, doc in (
            ("muxflow_service_requests_per_second", "The replica's request rate over its last recorded minute."),
            ("muxflow_service_latency_avg_seconds", "Average request latency over its last recorded minute."),
            ("muxflow_service_latency_p99_seconds", "p99 request latency over its last recorded minute."),
            ("muxflow_service_solo_latency_seconds", "Its recent latency without offline work on its GPU."),
            ("muxflow_service_slowdown_ratio", "Average latency over solo latency, minus 1, last recorded minute."),
            ("muxflow_service_slowdown_allowance_ratio", "The slowdown the service accepts (store)."),
            ("muxflow_service_latency_slo_seconds", "The service's latency SLO (store)."),
        )}
        over = CounterMetricFamily("muxflow_service_over_allowance_seconds",
                                   "Time in recorded whole minutes whose slowdown was over the service's allowance.",
                                   labels=svc_labels)
        slo = CounterMetricFamily("muxflow_service_slo_violation_seconds",
                                  "Time in recorded whole minutes whose p99 latency (average where no p99) was over "
                                  "the SLO.", labels=svc_labels)
        placed = {idx: loop.placements.on_gpu(idx) for idx, loop in self.agent.loops.items()}
        who_of = {j.job_id: self.jobs(j.job_id) or JobMeta("", "") for js in placed.values() for j in js}
        try:
            counters = self.xcuda(sorted({(j.slurm_job_id, who_of[j.job_id].user) for js in placed.values()
                                          for j in js if j.slurm_job_id is not None}))
        except Exception as exc:  # /proc or a job directory unreadable: no xCUDA series this scrape
            log.warning("metrics: cannot read xCUDA's counters: %s", exc)
            counters = {}
        for idx, loop in sorted(self.agent.loops.items()):
            meta = self.gpus.get(idx) or GpuMeta(idx, loop.b.gpu_id, "", "")
            gl = [str(idx), meta.uuid, meta.gpu_type, self.node, source]
            ml = [self.node, str(idx), meta.uuid, meta.gpu_type, source]
            snap = loop.snapshot()
            s = snap.sample
            if s is not None:
                free = _finite(s.mem_total_bytes - s.mem_used_bytes, MIB)  # NaN in either: none
                values = {
                    "DCGM_FI_DEV_GPU_UTIL": _finite(s.gpu_util_pct),
                    "DCGM_FI_PROF_SM_ACTIVE": _finite(s.sm_activity_pct, 100),
                    "DCGM_FI_PROF_SM_OCCUPANCY": _finite(s.sm_occupancy_pct, 100),
                    "DCGM_FI_DEV_MEM_COPY_UTIL": _finite(s.mem_bw_util_pct),
                    "DCGM_FI_DEV_FB_USED": _finite(s.mem_used_bytes, MIB),
                    "DCGM_FI_DEV_FB_FREE": None if free is None else max(0.0, free),
                    "DCGM_FI_DEV_SM_CLOCK": _finite(s.sm_clock_mhz),
                    "DCGM_FI_DEV_POWER_USAGE": _finite(s.power_w),
                    "DCGM_FI_DEV_GPU_TEMP": _finite(s.temperature_c),
                }
                for name, v in values.items():
                    if v is not None:
                        g[name].add_metric(gl, v)
            if snap.sample_epoch_s is not None:
                last.add_metric(ml, snap.sample_epoch_s)
            for st in GpuHealth:
                health.add_metric(ml + [st.value], 1.0 if snap.health == st.value else 0.0)
            if snap.burst is not None:
                burst.add_metric(ml, 1.0 if snap.burst else 0.0)
            gpu_counters["muxflow_gpu_xid_errors"].add_metric(ml, snap.xids)
            gpu_counters["muxflow_gpu_evictions"].add_metric(ml, snap.evictions)
            gpu_counters["muxflow_gpu_samples"].add_metric(ml, snap.samples)
            gpu_counters["muxflow_gpu_sample_gaps"].add_metric(ml, snap.gaps)
            for j in placed.get(idx, ()):
                who = who_of[j.job_id]
                jl = [self.node, str(idx), meta.uuid, "" if j.slurm_job_id is None else str(j.slurm_job_id),
                      str(j.job_id), who.user, who.job_type]
                share.add_metric(jl, j.sm_pct / 100.0)
                quota.add_metric(jl, float(j.mem_bytes))
                procs = counters.get(j.slurm_job_id, []) if j.slurm_job_id is not None else []
                if procs:
                    paced = [p.rate for p in procs if not p.gate_open]
                    for name, v in (("muxflow_job_memory_charged_bytes", sum(p.mem_used_bytes for p in procs)),
                                    ("muxflow_job_xcuda_launches", sum(p.launches for p in procs)),
                                    ("muxflow_job_xcuda_waits", sum(p.waits for p in procs)),
                                    ("muxflow_job_xcuda_wait_seconds", sum(p.waited_ns for p in procs) / 1e9),
                                    ("muxflow_job_xcuda_launch_rate_limit", sum(paced) if paced else None),
                                    ("muxflow_job_xcuda_fallback", 1.0 if any(p.fallback for p in procs) else 0.0),
                                    ("muxflow_job_xcuda_processes", len(procs))):
                        if v is not None:
                            xc[name].add_metric(jl, float(v))
            service = self.services.get(idx)
            if service is not None:
                sl = [service.name, self.node, str(idx)]
                row = snap.row
                lat = _finite(getattr(row, "online_latency_ms", None))
                solo = _finite(getattr(row, "online_solo_latency_ms", None))
                for name, v in (("muxflow_service_requests_per_second", _finite(getattr(row, "online_qps", None))),
                                ("muxflow_service_latency_avg_seconds", _finite(lat, 1000)),
                                ("muxflow_service_latency_p99_seconds",
                                 _finite(getattr(row, "online_latency_p99_ms", None), 1000)),
                                ("muxflow_service_solo_latency_seconds", _finite(solo, 1000)),
                                ("muxflow_service_slowdown_ratio", slowdown(lat, solo)),
                                ("muxflow_service_slowdown_allowance_ratio", service.slowdown_allowance),
                                ("muxflow_service_latency_slo_seconds", service.latency_slo_ms / 1000)):
                    if v is not None:
                        svc[name].add_metric(sl, v)
                over.add_metric(sl, 60.0 * self._over.get(idx, 0))
                slo.add_metric(sl, 60.0 * self._over_slo.get(idx, 0))
        for (job_id, sid), n in sorted(self.agent.job_evictions().items(), key=str):
            job_evictions.add_metric([self.node, "" if sid is None else str(sid),
                                      "" if job_id is None else str(job_id)], n)
        agent_labels = ["node"]
        ticks = CounterMetricFamily("muxflow_node_agent_ticks", "Sampling ticks.", labels=agent_labels)
        ticks.add_metric([self.node], self.agent.ticks)
        late = CounterMetricFamily("muxflow_node_agent_late_ticks", "Ticks skipped because sampling fell behind.",
                                   labels=agent_labels)
        late.add_metric([self.node], self.agent.overruns)
        yield from g.values()
        yield from (health, burst, last, *gpu_counters.values(), share, quota, *xc.values(), job_evictions,
                    *svc.values(), over, slo, ticks, late)


def slowdown(latency_ms: float | None, solo_ms: float | None) -> float | None:
    """Latency over solo latency, minus one (0 = as fast as alone); None without both."""
    if latency_ms is None or solo_ms is None or solo_ms <= 0:
        return None
    return latency_ms / solo_ms - 1.0
