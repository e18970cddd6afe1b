"""Settings of a simulation run: cluster, online services, trace shaping and sharing-model constants."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_core.interference.gpu_model import XCUDA_TARGET_UTIL
from scheduler_core.gpu_specs import GPU_SPECS
from scheduler_core.interference.pairs import InterferenceParams
from scheduler_core.online.budget_pacing import PacingParams
from scheduler_core.online.correction import CorrectionParams
from scheduler_core.online.latency_budget import DEFAULT_SLOWDOWN_ALLOWANCE, DEFAULT_SLOWDOWN_BUDGET
from scheduler_core.online.load import peak_slo_ms
from scheduler_core.guard.burst import BurstParams
from scheduler_core.guard.sysmonitor import SysMonitorConfig
from scheduler_core.workloads import ONLINE_FAMILIES


@dataclass(frozen=True)
class ServiceSpec:
    """An online inference service: its family, daily request-rate range (QPS) and peak hour."""

    name: str
    family: str
    qps_min: float
    qps_max: float
    peak_hour_utc: float
    slowdown_allowance: float = DEFAULT_SLOWDOWN_ALLOWANCE
    # p99 latency SLO (ms): a pair is feasible only if the replica's p99 alone at the forecast load
    # (scheduler_core.online.latency_model) times the predicted slowdown stays within it. None: no SLO.
    slo_p99_ms: float | None = None
    # The mean slowdown of its requests the service accepts over the day (scheduler_core.online.latency_budget),
    # paced to what its requests spent (scheduler_core.online.budget_pacing): MuxFlow rounds share its GPUs more in
    # quiet minutes and less at the peak, each minute within ``slowdown_allowance``. None: the flat allowance on
    # every minute (the paper's, at 0.2).
    slowdown_budget: float | None = DEFAULT_SLOWDOWN_BUDGET

    def __post_init__(self) -> None:
        if self.family not in ONLINE_FAMILIES:
            raise ValueError(f"service {self.name}: unknown family {self.family!r} "
                             f"(known: {', '.join(sorted(ONLINE_FAMILIES))})")
        if not 0 < self.qps_min <= self.qps_max:
            raise ValueError(f"service {self.name}: need 0 < qps_min <= qps_max")
        if not self.slowdown_allowance >= 0 or (self.slowdown_budget is not None and not self.slowdown_budget >= 0):
            raise ValueError(f"service {self.name}: slowdown allowance and budget must be >= 0")
        if self.slo_p99_ms is not None and not self.slo_p99_ms > 0:
            raise ValueError(f"service {self.name}: slo_p99_ms must be > 0")


# Three services spanning the paper's 20–190 QPS (§7.1), peaking at different hours. They declare no
# SLO (the paper's flat allowance); SimConfig.slo_scale gives each one.
DEFAULT_SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec("search-cnn", "cnn", 20.0, 190.0, 20.0),
    ServiceSpec("translate-transformer", "transformer", 20.0, 150.0, 14.0),
    ServiceSpec("ads-recommender", "recommender", 30.0, 190.0, 21.0),
)


@dataclass(frozen=True)
class SharingParams:
    """Constants of the time-sharing models (the baselines). Modelled, not measured: see docs/EVALUATION.md.

    Time-sharing (GPU driver time slices, Gandiva): an online kernel that finds
    the offline context on the GPU waits for its slice; on average that
    stretches a request by ``ts_online_wait`` of its solo latency while an
    offline job runs, and online busy periods grow by the same factor.
    PB-time-sharing (AntMan/PAI): online work preempts at the next kernel
    boundary (``pb_online_wait``); the offline job only gets the time the online
    service leaves idle, at ``pb_offline_efficiency`` (preemption, context
    switches, cold caches). Salus: switches between jobs at iteration
    boundaries, so an online request waits for the residual offline iteration
    (half an iteration on average) whenever one is in flight; switching itself
    is cheap (``salus_offline_efficiency``).
    """

    ts_online_wait: float = 0.45
    ts_switch_overhead: float = 0.05
    pb_online_wait: float = 0.04
    pb_offline_efficiency: float = 0.85
    salus_offline_efficiency: float = 0.95
    salus_max_resident: int = 4
    salus_mem_frac: float = 0.9


@dataclass(frozen=True)
class SimConfig:
    gpus: int = 1000
    # GPU types and counts; default: all T4, as in the paper's testbed.
    gpu_types: tuple[tuple[str, int], ...] | None = None
    hours: float = 24.0
    seed: int = 0
    round_minutes: int = 15
    warmup_minutes: int = 60  # online-only history before the first round (forecast input)
    # Trace shaping (paper §7.1: "repeat the workloads to fit in 1,000 GPUs and
    # guarantee that the generated traces can be finished in 24 hours").
    jobs: int | None = None  # repeat/truncate the trace to this many single-GPU jobs
    arrival_hours: float = 16.0  # trace arrivals compressed linearly into [0, arrival_hours)
    mean_job_hours: float = 1.0  # solo duration on the reference GPU, mean over the trace
    max_job_hours: float = 8.0  # longest solo duration after scaling
    reference_gpu: str = "p100"  # the GPU of the measured solo throughputs
    # Executor costs (paper §6, §7.2: image pull + init; checkpoint load on restart).
    startup_s: float = 60.0
    restart_s: float = 90.0
    checkpoint_interval_s: float = 600.0
    # Online load noise (per GPU, AR(1) per minute) and bursts.
    qps_noise_frac: float = 0.06
    burst_prob_per_min: float = 0.003
    burst_factor: float = 1.6
    burst_minutes: tuple[int, int] = (3, 12)
    services: tuple[ServiceSpec, ...] = DEFAULT_SERVICES
    interference: InterferenceParams = field(default_factory=InterferenceParams)
    # xCUDA's target GPU load on GPUs an MPS policy shares (gpu_model.xcuda_pace); None: unpaced.
    xcuda_target_util: float | None = XCUDA_TARGET_UTIL
    # The node agent's burst guard on GPUs an MPS policy shares: a replica's request rate over its recent level
    # paces the GPU's offline work to xCUDA's floor (scheduler_core.guard.burst); None: no guard.
    burst_guard: BurstParams | None = field(default_factory=BurstParams)
    sysmonitor: SysMonitorConfig = field(default_factory=SysMonitorConfig)
    sharing: SharingParams = field(default_factory=SharingParams)
    fixed_sm_pct: int = 50  # MuxFlow-S / -S-M: one SM percentage for every pair
    # Smaller MPS shares a MuxFlow round may fall back to (None: SmPolicy's default; 0 = the paper).
    sm_fallback_levels: int | None = None
    # Weight a MuxFlow round subtracts for moving a running job (RoundConfig.migration_penalty).
    # None: the throughput a restart costs over one interval, restart_s / interval (0.1 by default);
    # 0 reproduces the paper, whose matching ignores restart costs (docs/EVALUATION.md).
    migration_penalty: float | None = None
    # Users of the online replicas and offline jobs (scheduler_core.simulator.users): 0 = none declared (every
    # job may share every GPU), else that many teams with Zipf(users_zipf_s) weights; MPS policies then pair a
    # job only with a GPU whose replica runs as its team (scheduler_core.jobs.run_as).
    users: int = 0
    users_zipf_s: float = 1.0
    # p99 SLOs for services that declare none: this many times the replica's p99 alone at its daily peak on
    # the slowest GPU type (online.load.peak_slo_ms, rounded up to 10 ms). None: only declared SLOs.
    slo_scale: float | None = None
    # Offline jobs an MPS policy's round may put on one GPU, each with its own share (RoundConfig.max_jobs_per_gpu,
    # scheduler_core.round.slots); 1 = the paper.
    max_jobs_per_gpu: int = 1
    # Place waiting jobs between rounds too, in the minute a job arrives or a GPU frees (every policy's planner,
    # called with RoundView.between_rounds: MuxFlow's only starts waiting jobs on free GPUs), as the pipeline's
    # fills do on Slurm; False: rounds only (the paper).
    between_rounds: bool = True
    # How MuxFlow rounds correct each service's allowance on the outcome: a factor per service that tightens it while
    # its shared minutes' p99 slowdown is over the declared allowance and relaxes back to 1 (never looser) once within
    # (scheduler_core.online.correction), as the pipeline's rounds do; None: the allowance as declared (the paper).
    allowance_correction: CorrectionParams | None = field(default_factory=CorrectionParams)
    # How MuxFlow rounds pace a budgeted service's budget to what its requests spent in the last interval (up to its
    # allowance with headroom, down under overload: scheduler_core.online.budget_pacing), as the pipeline's rounds
    # do; None: the budget as declared on every round.
    budget_pacing: PacingParams | None = field(default_factory=PacingParams)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("gpus must be >= 1")
        if not self.hours > 0:
            raise ValueError("hours must be > 0")
        if self.round_minutes < 1:
            raise ValueError("round_minutes must be >= 1")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError("jobs must be >= 1")
        if not (0 < self.arrival_hours and 0 < self.mean_job_hours <= self.max_job_hours):
            raise ValueError("need arrival_hours > 0 and 0 < mean_job_hours <= max_job_hours")
        if not self.services:
            raise ValueError("at least one online service is needed")
        for name, count in self.types():
            if name not in GPU_SPECS:
                raise ValueError(f"unknown GPU type {name!r} (known: {', '.join(sorted(GPU_SPECS))})")
            if count < 1:
                raise ValueError(f"GPU type {name}: count must be >= 1")
        if sum(c for _, c in self.types()) != self.gpus:
            raise ValueError(f"GPU type counts add up to {sum(c for _, c in self.types())}, not {self.gpus}")
        if self.migration_penalty is not None and not self.migration_penalty >= 0:
            raise ValueError("migration_penalty must be >= 0")
        if not 1 <= self.fixed_sm_pct <= 100:
            raise ValueError("fixed_sm_pct must lie in [1, 100]")
        if self.xcuda_target_util is not None and not 0.0 < self.xcuda_target_util <= 2.0:
            raise ValueError("xcuda_target_util must lie in (0, 2] (a GPU load, as XCUDA_TARGET_UTIL)")
        if self.slo_scale is not None and not self.slo_scale > 0:
            raise ValueError("slo_scale must be > 0")
        if self.max_jobs_per_gpu < 1:
            raise ValueError("max_jobs_per_gpu must be >= 1")
        if self.users < 0:
            raise ValueError("users must be >= 0")
        if not self.users_zipf_s >= 0:
            raise ValueError("users_zipf_s must be >= 0")

    def round_migration_penalty(self) -> float:
        if self.migration_penalty is not None:
            return self.migration_penalty
        return self.restart_s / (self.round_minutes * 60.0)

    def service_slos_ms(self) -> tuple[float | None, ...]:
        """Each service's p99 SLO (ms): its own, else from ``slo_scale``, else None (no SLO)."""
        specs = [GPU_SPECS[t] for t, _ in self.types()]
        return tuple(s.slo_p99_ms if s.slo_p99_ms is not None
                     else None if self.slo_scale is None
                     else peak_slo_ms(ONLINE_FAMILIES[s.family], specs, s.qps_max, self.slo_scale)
                     for s in self.services)

    def types(self) -> tuple[tuple[str, int], ...]:
        return self.gpu_types if self.gpu_types is not None else (("t4", self.gpus),)

    @property
    def minutes(self) -> int:
        return int(round(self.hours * 60))
