"""A simulated GPU cluster: the honest stand-in for real GPUs on machines without them.

Every GPU runs one online service replica whose request rate follows its
daily cycle (with noise and occasional bursts); the offline jobs placed on the
GPU (one, or several where the round splits it) run under their MPS shares. What the GPU reports, the job's normalized
throughput and the service's slowdown come from the one simulated GPU model,
``scheduler_core.interference.gpu_model``. A SysMonitor per GPU evicts offline work
on Overlimit. Everything it reports is labelled ``simulated``.

Randomness comes from one named stream per purpose derived from a single seed
(per interval, named by its start, so any process simulates a window alike).
Its state between rounds is exported as JSON and kept in the store
(``executors.simulated.setup.open_simulated_cluster``).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field

import numpy as np

from executors.cluster import (
    DispatchResult,
    EvictionRecord,
    ExecutionRecord,
    IntervalReport,
    MetricRow,
    RunningJob,
)
from scheduler_core.domain import Action, GpuHealth, GpuTypeSpec, PlanAction
from scheduler_core.interference.gpu_model import (
    XCUDA_TARGET_UTIL,
    OnlineModel,
    clock_frac,
    on_one_gpu,
    online_alone,
)
from scheduler_core.gpu_specs import get_spec
from scheduler_core.guard.burst import BURST_TARGET_UTIL, BurstGuard, BurstParams, modelled_over_limit
from scheduler_core.interference.pairs import InterferenceParams
from scheduler_core.online.load import diurnal_qps
from scheduler_core.rng import rng_stream  # noqa: F401  (re-exported: executors use it from here)
from scheduler_core.guard.sysmonitor import GpuSample, SysMonitor, SysMonitorConfig
from scheduler_core.workloads import ONLINE_FAMILIES, WorkloadCatalog

SOURCE = "simulated"

log = logging.getLogger(__name__)


STATE_VERSION = 1


@dataclass(frozen=True)
class SimServiceSpec:
    name: str
    family: str
    qps_min: float
    qps_max: float
    peak_hour_utc: float
    mem_bytes: int
    latency_slo_ms: float | None = None  # the service's p99 SLO (the node's burst guard reads it)


@dataclass(frozen=True)
class SimGpuSpec:
    gpu_id: int
    gpu_type: str
    service: SimServiceSpec


@dataclass(frozen=True)
class SimJobSpec:
    job_id: int
    job_type: str
    total_steps: int
    steps_done: float = 0.0
    mem_bytes: int = 0


@dataclass(frozen=True)
class SimSettings:
    seed: int = 0
    startup_s: float = 60.0  # container start and CUDA init of an offline job
    restart_s: float = 90.0  # checkpoint load on a migration restart
    checkpoint_interval_s: float = 600.0
    qps_noise_frac: float = 0.06
    burst_prob_per_min: float = 0.003
    burst_factor: float = 1.6
    burst_minutes: tuple[int, int] = (3, 12)
    interference: InterferenceParams = field(default_factory=InterferenceParams)
    # xCUDA's target GPU load, as the offline job's preload paces it (None: unpaced; gpu_model.xcuda_pace).
    xcuda_target_util: float | None = XCUDA_TARGET_UTIL
    # The node agent's burst guard: a replica's rate over its recent level paces the GPU's offline work to xCUDA's
    # floor (scheduler_core.guard.burst; needs xCUDA); None: no guard.
    burst_guard: BurstParams | None = field(default_factory=BurstParams)
    sysmonitor: SysMonitorConfig = field(default_factory=SysMonitorConfig)
    # As NVML under MPS on a real GPU: no online split (utilization, SM activity, memory bandwidth) in a minute
    # an offline job shared the GPU (docs/NODE_AGENT.md). False: the model's split in every minute.
    mps_split_gaps: bool = False


@dataclass
class _Gpu:
    spec: SimGpuSpec
    gtype: GpuTypeSpec
    model: OnlineModel
    monitor: SysMonitor
    noise: float = 0.0
    burst_left: int = 0
    guard: BurstGuard | None = None  # the node agent's burst guard on this GPU (None: off)


@dataclass
class _Job:
    spec: SimJobSpec
    gpu_id: int
    sm_pct: int
    steps_done: float
    checkpoint_step: float
    warmup_left_s: float
    exec_start: dt.datetime
    exec_steps: float = 0.0
    exec_wall_s: float = 0.0
    last_checkpoint_s: float = 0.0


class SimulatedCluster:
    """Implements :class:`executors.cluster.Cluster` over modelled GPUs."""

    simulated = True
    starts_jobs_at_once = True  # a placed job runs from the next simulated minute (start-up cost modelled)

    def __init__(self, gpus: list[SimGpuSpec], catalog: WorkloadCatalog, settings: SimSettings = SimSettings()):
        self.settings = settings
        self.catalog = catalog
        self._gpus: dict[int, _Gpu] = {}
        for g in gpus:
            fam, spec = ONLINE_FAMILIES[g.service.family], get_spec(g.gpu_type)
            model = OnlineModel.of(fam, catalog.online[fam.name], spec, g.service.mem_bytes)
            guard = (BurstGuard(1, settings.burst_guard)
                     if settings.burst_guard is not None and settings.xcuda_target_util is not None else None)
            self._gpus[g.gpu_id] = _Gpu(g, spec, model, SysMonitor(settings.sysmonitor), guard=guard)
        self._jobs: dict[int, _Job] = {}
        self._known_jobs: dict[int, SimJobSpec] = {}
        self._noise_rng = rng_stream(settings.seed, "online-load")
        self._burst_rng = rng_stream(settings.seed, "bursts")
        # Executions closed and resume points set by dispatch or events between reports.
        self._pending_execs: list[ExecutionRecord] = []
        self._pending_progress: dict[int, tuple[float, float]] = {}

    # -- jobs known to the cluster (the queue of record lives in the store) --
    def register_job(self, job: SimJobSpec) -> None:
        self._known_jobs[job.job_id] = job

    def running(self) -> dict[int, RunningJob]:
        return {j: RunningJob(j, r.gpu_id, r.sm_pct) for j, r in self._jobs.items()}

    def health(self) -> dict[int, GpuHealth]:
        return {gid: g.monitor.state for gid, g in self._gpus.items()}

    def solo_steps_per_s(self, job_type: str, gpu_type: str) -> float:
        return self.catalog.offline_workload(job_type).solo_steps_per_s_p100 * get_spec(gpu_type).relative_speed

    # -- dispatch --------------------------------------------------------------
    def dispatch(self, actions: list[PlanAction], now_utc: dt.datetime) -> list[DispatchResult]:
        results: dict[int, DispatchResult] = {}
        # Evictions, then the checkpoint half of every migration, free GPUs before
        # restarts and starts claim them, so swaps and chains of moves succeed.
        order = {Action.EVICT: 0, Action.MIGRATE: 1, Action.KEEP: 2, Action.START: 3}
        ranked = sorted(enumerate(actions), key=lambda p: order[p[1].action])
        parked: dict[int, float] = {}
        for i, act in ranked:
            job = self._jobs.get(act.job_id)
            if act.action == Action.MIGRATE and job is not None and not (job.gpu_id == act.gpu_id and job.sm_pct == act.sm_pct):
                parked[act.job_id] = self._stop(job, now_utc, checkpoint=True)
        for i, act in ranked:
            if act.job_id in parked:
                results[i] = self._restart(act, parked[act.job_id], now_utc)
            else:
                results[i] = self._apply(act, now_utc)
        return [results[i] for i in range(len(actions))]

    def _restart(self, act: PlanAction, steps: float, now: dt.datetime) -> DispatchResult:
        holder = next((j for j in self._jobs.values() if j.gpu_id == act.gpu_id), None)
        if holder is not None or act.gpu_id not in self._gpus:
            # The checkpoint is safe; the job waits in the queue for the next round.
            return DispatchResult(act, False, f"checkpointed, but GPU {act.gpu_id} is not free")
        self._jobs[act.job_id] = _Job(
            self._known_jobs[act.job_id], act.gpu_id, int(act.sm_pct or 0), steps, steps, self.settings.restart_s, now
        )
        return DispatchResult(act, True, "checkpointed and restarted")

    def _apply(self, act: PlanAction, now: dt.datetime) -> DispatchResult:
        job = self._jobs.get(act.job_id)
        if act.action == Action.KEEP:
            ok = job is not None and job.gpu_id == act.gpu_id
            return DispatchResult(act, ok, "" if ok else "job is not running where the plan keeps it")
        if act.action == Action.EVICT:
            if job is None:
                return DispatchResult(act, True, "already stopped")
            self._stop(job, now, checkpoint=True)
            return DispatchResult(act, True, "checkpointed and requeued")
        if act.gpu_id not in self._gpus:
            return DispatchResult(act, False, f"unknown GPU {act.gpu_id}")
        # Several jobs may share a GPU (each its own MPS share); their shares never add up to more than the GPU.
        others = [j for j in self._jobs.values() if j.gpu_id == act.gpu_id and j.spec.job_id != act.job_id]
        if others and sum(j.sm_pct for j in others) + int(act.sm_pct or 0) > 100:
            held = ", ".join(f"job {j.spec.job_id} at {j.sm_pct} %" for j in others)
            return DispatchResult(act, False, f"GPU {act.gpu_id} still hosts {held}: no room for {act.sm_pct} %")
        if act.action == Action.START:
            if job is not None:
                ok = job.gpu_id == act.gpu_id and job.sm_pct == act.sm_pct
                return DispatchResult(act, ok, "already running" if ok else "running elsewhere")
            spec = self._known_jobs.get(act.job_id)
            if spec is None:
                return DispatchResult(act, False, f"unknown job {act.job_id}")
            self._jobs[act.job_id] = _Job(
                spec, act.gpu_id, int(act.sm_pct or 0), spec.steps_done, spec.steps_done, self.settings.startup_s, now
            )
            return DispatchResult(act, True, "started")
        # MIGRATE of a job already where the plan wants it (a repeated dispatch).
        if job is not None and job.gpu_id == act.gpu_id and job.sm_pct == act.sm_pct:
            return DispatchResult(act, True, "already migrated")
        return DispatchResult(act, False, "migrate of a job that is not running")

    def stop(self, job_id: int, now: dt.datetime) -> bool:
        """Stop a running job for good (cancelled): its execution up to ``now`` is booked with the next interval.
        Whether it was running."""
        job = self._jobs.get(job_id)
        if job is None:
            return False
        self._stop(job, now, checkpoint=True)
        return True

    def _stop(self, job: _Job, now: dt.datetime, checkpoint: bool) -> float:
        """Remove a running job; return the step it resumes from."""
        self._pending_execs.append(self._close_execution(job, now))
        del self._jobs[job.spec.job_id]
        resume = job.steps_done if checkpoint else job.checkpoint_step
        spec = self._known_jobs[job.spec.job_id]
        self._known_jobs[job.spec.job_id] = SimJobSpec(spec.job_id, spec.job_type, spec.total_steps, resume, spec.mem_bytes)
        self._pending_progress[job.spec.job_id] = (resume, resume)
        return resume

    def _close_execution(self, job: _Job, now: dt.datetime) -> ExecutionRecord:
        solo = self.solo_steps_per_s(job.spec.job_type, self._gpus[job.gpu_id].spec.gpu_type)
        rec = ExecutionRecord(
            job.spec.job_id, job.gpu_id, job.exec_start, now, job.sm_pct, job.exec_steps,
            job.exec_wall_s, job.exec_steps / solo,
        )
        job.exec_start, job.exec_steps, job.exec_wall_s = now, 0.0, 0.0
        return rec

    # -- state between processes ------------------------------------------------
    def export_state(self) -> dict:
        """JSON-able node-agent state: per-GPU load noise and SysMonitor, running jobs, unreported records."""
        return {
            "version": STATE_VERSION,
            "gpus": {
                str(gid): {
                    "noise": g.noise, "burst_left": g.burst_left, "health": g.monitor.state.value,
                    "burst_guard": g.guard.to_state() if g.guard is not None else None,
                    "overlimit_entries_s": list(g.monitor.overlimit_entries_s), "calm_since_s": g.monitor.calm_since_s,
                }
                for gid, g in self._gpus.items()
            },
            "jobs": {
                str(j.spec.job_id): {
                    "gpu_id": j.gpu_id, "sm_pct": j.sm_pct, "steps_done": j.steps_done,
                    "checkpoint_step": j.checkpoint_step, "warmup_left_s": j.warmup_left_s,
                    "exec_start": j.exec_start.isoformat(), "exec_steps": j.exec_steps,
                    "exec_wall_s": j.exec_wall_s, "last_checkpoint_s": j.last_checkpoint_s,
                }
                for j in self._jobs.values()
            },
            "pending_execs": [
                {**asdict(e), "start_utc": e.start_utc.isoformat(), "end_utc": e.end_utc.isoformat()}
                for e in self._pending_execs
            ],
            "pending_progress": {str(k): list(v) for k, v in self._pending_progress.items()},
        }

    def load_state(self, state: dict) -> None:
        """Restore :meth:`export_state`'s output. Jobs must be registered first; a running job the store no
        longer lists as live (cancelled while another process simulated the cluster) is dropped."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"simulated cluster state version {state.get('version')!r}, expected {STATE_VERSION}")
        for gid, gs in state["gpus"].items():
            g = self._gpus.get(int(gid))
            if g is None:
                continue  # GPU removed from the cluster since
            g.noise, g.burst_left = float(gs["noise"]), int(gs["burst_left"])
            if g.guard is not None:  # a state written before the guard existed starts it afresh
                g.guard = BurstGuard.from_state(1, g.guard.params, gs.get("burst_guard"))
            g.monitor.state = GpuHealth(gs["health"])
            g.monitor.overlimit_entries_s = [float(t) for t in gs["overlimit_entries_s"]]
            g.monitor.calm_since_s = gs["calm_since_s"]
        self._jobs = {}
        for jid, js in state["jobs"].items():
            spec = self._known_jobs.get(int(jid))
            if spec is None:
                log.warning("simulated state runs job %s, which the store no longer lists as live: dropped", jid)
                continue
            self._jobs[int(jid)] = _Job(
                spec, int(js["gpu_id"]), int(js["sm_pct"]), float(js["steps_done"]), float(js["checkpoint_step"]),
                float(js["warmup_left_s"]), dt.datetime.fromisoformat(js["exec_start"]), float(js["exec_steps"]),
                float(js["exec_wall_s"]), float(js["last_checkpoint_s"]),
            )
        self._pending_execs = [
            ExecutionRecord(**{**e, "start_utc": dt.datetime.fromisoformat(e["start_utc"]),
                               "end_utc": dt.datetime.fromisoformat(e["end_utc"])})
            for e in state["pending_execs"]
        ]
        self._pending_progress = {int(k): (float(v[0]), float(v[1])) for k, v in state["pending_progress"].items()}

    # -- time ------------------------------------------------------------------
    def advance(self, start_utc: dt.datetime, minutes: int) -> IntervalReport:
        """Run the cluster for ``minutes`` simulated minutes from ``start_utc``."""
        report = IntervalReport()
        # One random stream per interval, named by its start: the same window
        # gives the same load whichever process simulates it.
        self._noise_rng = rng_stream(self.settings.seed, f"online-load@{start_utc.isoformat()}")
        self._burst_rng = rng_stream(self.settings.seed, f"bursts@{start_utc.isoformat()}")
        for minute in range(minutes):
            now = start_utc + dt.timedelta(minutes=minute)
            hour = now.hour + now.minute / 60.0
            for gid, g in self._gpus.items():
                report.metrics.append(self._step_gpu(gid, g, now, hour, report))
        end = start_utc + dt.timedelta(minutes=minutes)
        for job in self._jobs.values():
            report.executions.append(self._close_execution(job, end))
            report.progress[job.spec.job_id] = (job.steps_done, job.checkpoint_step)
        report.executions.extend(e for e in self._pending_execs if e.wall_s > 0 or e.steps > 0)
        for job_id, prog in self._pending_progress.items():
            report.progress.setdefault(job_id, prog)
        self._pending_execs, self._pending_progress = [], {}
        report.health = {gid: g.monitor.state.value for gid, g in self._gpus.items()}
        return report

    def _online_qps(self, g: _Gpu, hour: float) -> float:
        s = self.settings
        g.noise = 0.8 * g.noise + self._noise_rng.normal(0.0, s.qps_noise_frac)
        if g.burst_left > 0:
            g.burst_left -= 1
        elif self._burst_rng.random() < s.burst_prob_per_min:
            g.burst_left = int(self._burst_rng.integers(s.burst_minutes[0], s.burst_minutes[1] + 1))
        svc = g.spec.service
        qps = float(diurnal_qps(hour, svc.qps_min, svc.qps_max, svc.peak_hour_utc)) * (1.0 + g.noise)
        if g.burst_left > 0:
            qps *= s.burst_factor
        return max(0.0, qps)

    def _step_gpu(self, gid: int, g: _Gpu, now: dt.datetime, hour: float, report: IntervalReport) -> MetricRow:
        gt = g.gtype
        qps = self._online_qps(g, hour)
        on = online_alone(g.model, qps)
        jobs = sorted((j for j in self._jobs.values() if j.gpu_id == gid), key=lambda j: (-j.sm_pct, j.spec.job_id))
        active = [max(0.0, 60.0 - j.warmup_left_s) for j in jobs]  # no kernels of its own during start-up or restart
        args = (on, g.model, [self.catalog.offline_workload(j.spec.job_type).traits for j in jobs],
                [j.sm_pct for j in jobs], [a / 60.0 for a in active], [j.spec.mem_bytes for j in jobs],
                self.settings.interference)
        shared, tput = on_one_gpu(*args, self.settings.xcuda_target_util)
        if g.guard is not None:
            # The node agent sees the replica's rate and p99 as they are (shared), then acts: in a burst the GPU's
            # offline work waits at xCUDA's floor.
            # every service in the store has an SLO; None: the rate alone decides
            over = modelled_over_limit(on.latency_ms, shared.slowdown, g.spec.service.latency_slo_ms)
            if g.guard.update(qps, over)[0] and jobs:
                shared, tput = on_one_gpu(*args, BURST_TARGET_UTIL)
            g.guard.record_minute(qps)
        for job, active_s, t in zip(jobs, active, tput.tolist()):
            job.warmup_left_s = max(0.0, job.warmup_left_s - 60.0)
            steps = t * self.solo_steps_per_s(job.spec.job_type, gt.name) * active_s
            steps = min(steps, job.spec.total_steps - job.steps_done)
            job.steps_done += steps
            job.exec_steps += steps
            job.exec_wall_s += 60.0
            job.last_checkpoint_s += 60.0
            if job.last_checkpoint_s >= self.settings.checkpoint_interval_s:
                job.checkpoint_step, job.last_checkpoint_s = job.steps_done, 0.0
        util, sm_act, mem = float(shared.util_pct), float(shared.sm_pct), float(shared.mem_bytes)
        clock = float(clock_frac(sm_act, gt.clock_drop_frac))
        sample = GpuSample(util, sm_act, clock, mem / gt.memory_bytes)
        g.monitor.step(now.timestamp() + 60.0, sample)
        solo_lat = float(on.latency_ms)
        split = not (jobs and self.settings.mps_split_gaps)
        row = MetricRow(
            gpu_id=gid, minute_utc=now, gpu_util_pct=util, sm_activity_pct=sm_act,
            sm_occupancy_pct=sm_act * 0.55, mem_used_bytes=mem, mem_total_bytes=float(gt.memory_bytes),
            mem_bw_util_pct=float(shared.bw_pct), sm_clock_mhz=clock * gt.max_sm_clock_mhz, power_w=None,
            temperature_c=None, online_gpu_util_pct=float(on.util_pct) if split else None,
            online_sm_activity_pct=float(on.sm_pct) if split else None,
            online_mem_used_bytes=float(on.mem_bytes), online_mem_bw_util_pct=float(on.bw_pct) if split else None,
            online_qps=float(on.qps), online_latency_ms=solo_lat * float(shared.slowdown),
            online_solo_latency_ms=solo_lat, offline_job_id=jobs[0].spec.job_id if jobs else None,
            health=g.monitor.state.value,
        )
        end = now + dt.timedelta(minutes=1)
        for job in jobs:
            if job.steps_done >= job.spec.total_steps:
                report.completed[job.spec.job_id] = end
                self._pending_execs.append(self._close_execution(job, end))
                report.progress[job.spec.job_id] = (job.steps_done, job.steps_done)
                del self._jobs[job.spec.job_id]
            elif g.monitor.state == GpuHealth.OVERLIMIT:
                lost = job.steps_done - job.checkpoint_step
                report.evictions.append(
                    EvictionRecord(job.spec.job_id, gid, end, _overlimit_reason(sample, self.settings.sysmonitor),
                                   g.monitor.state.value, lost)
                )
                self._stop(job, end, checkpoint=False)
        return row


def _overlimit_reason(s: GpuSample, cfg: SysMonitorConfig) -> str:
    return "SysMonitor Overlimit (simulated): " + "; ".join(cfg.overlimit.reasons(s) or ["threshold reached"])
