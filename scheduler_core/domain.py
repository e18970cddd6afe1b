"""Domain types shared by every layer: job and GPU states, GPU specifications, plans.

Plain data only. The feature store persists these; the core computes on them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class JobState(str, enum.Enum):
    """Offline job life cycle (docs/DESIGN.md §3)."""

    SUBMITTED = "SUBMITTED"
    PROFILING = "PROFILING"
    PENDING = "PENDING"
    PLACED = "PLACED"  # released on its planned GPU by a round; the cluster has not started it yet
    RUNNING = "RUNNING"
    MIGRATING = "MIGRATING"
    EVICTED = "EVICTED"
    DONE = "DONE"
    FAILED = "FAILED"


# Every legal move of the state machine. Anything else is refused before it
# reaches the store. FAILED is reachable from every live state because a job can
# crash (or be rejected) at any point; DONE only from RUNNING because only a
# running job makes progress.
#
# PLACED is the time between a round releasing a job on its planned GPU and the
# cluster starting it (Slurm: released, still pending; a simulated cluster starts
# jobs at once, PENDING -> RUNNING). A placed job may be moved (MIGRATING), held
# again before it starts (-> PENDING), or evicted. A running job goes back to
# PENDING without an eviction when the cluster requeued it on its own (Slurm's
# requeue after a node failure).
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.SUBMITTED: frozenset({JobState.PROFILING, JobState.FAILED}),
    # A job is profiled in its own Slurm job (a profiling window): it may end there.
    JobState.PROFILING: frozenset({JobState.PENDING, JobState.DONE, JobState.FAILED}),
    JobState.PENDING: frozenset({JobState.PLACED, JobState.RUNNING, JobState.FAILED}),
    JobState.PLACED: frozenset(
        {JobState.RUNNING, JobState.MIGRATING, JobState.PENDING, JobState.EVICTED, JobState.FAILED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.MIGRATING, JobState.EVICTED, JobState.PENDING, JobState.DONE, JobState.FAILED}
    ),
    JobState.MIGRATING: frozenset({JobState.PLACED, JobState.RUNNING, JobState.PENDING, JobState.FAILED}),
    JobState.EVICTED: frozenset({JobState.PENDING, JobState.FAILED}),
    JobState.DONE: frozenset(),
    JobState.FAILED: frozenset(),
}

TERMINAL_JOB_STATES = frozenset({JobState.DONE, JobState.FAILED})
# A round considers these: waiting (PENDING) or holding a GPU (PLACED, RUNNING).
SCHEDULABLE_JOB_STATES = (JobState.PENDING, JobState.PLACED, JobState.RUNNING)


class IllegalTransition(ValueError):
    """A job state change that the state machine does not allow."""


def check_transition(current: JobState, target: JobState) -> None:
    if target not in JOB_TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in JOB_TRANSITIONS[current])) or "none"
        raise IllegalTransition(
            f"illegal job transition {current.value} -> {target.value} (allowed: {allowed})"
        )


class GpuHealth(str, enum.Enum):
    """SysMonitor states (paper §4.1, Fig. 6b)."""

    INIT = "Init"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    OVERLIMIT = "Overlimit"
    DISABLED = "Disabled"


@dataclass(frozen=True)
class GpuTypeSpec:
    """Public specification of a GPU model.

    ``relative_speed`` is the training throughput relative to a P100, used only
    by the simulated cluster to scale the measured (K80/P100) throughputs to
    newer GPU types.
    """

    name: str
    sm_count: int
    memory_bytes: int
    max_sm_clock_mhz: int
    relative_speed: float
    # How far the SM clock drops under full load (T4's 70 W cap makes it large).
    clock_drop_frac: float


@dataclass(frozen=True)
class OfflineFeatures:
    """Solo features of an offline job on one GPU type (docs/DESIGN.md §5), from profiling."""

    gpu_util_pct: float
    sm_activity_pct: float
    sm_occupancy_pct: float
    mem_used_bytes: float
    mem_bw_util_pct: float
    iter_time_s: float
    sm_clock_mhz: float


@dataclass(frozen=True)
class OnlineFeatures:
    """Solo features of an online service on its GPU (docs/DESIGN.md §5), from the GPU monitor."""

    gpu_util_pct: float
    sm_activity_pct: float
    sm_occupancy_pct: float
    mem_used_bytes: float
    mem_bw_util_pct: float
    latency_ms: float
    qps: float
    sm_clock_mhz: float


@dataclass(frozen=True)
class GpuCandidate:
    """One GPU as a round sees it: its type, health, online service and forecast load."""

    gpu_id: int
    gpu_type: str
    memory_bytes: int
    max_sm_clock_mhz: int
    health: GpuHealth
    service_name: str
    online: OnlineFeatures
    forecast_sm_pct: float
    forecast_mem_bytes: float
    slowdown_allowance: float  # max tolerated online latency slowdown, e.g. 0.2 = +20 %
    current_job_id: int | None = None  # a job running there (the round reads all of them from the jobs)
    current_sm_pct: int | None = None
    # The service's p99 latency SLO and its replica's p99 alone at the forecast load
    # (scheduler_core.online.latency_model); with both, the SLO bounds the allowance.
    latency_slo_ms: float | None = None
    forecast_p99_ms: float | None = None
    # The user the online replica runs as: only jobs of that user share the GPU (MPS serves one uid per GPU,
    # scheduler_core.jobs.run_as); None: not declared, any job.
    run_as_user: str | None = None


@dataclass(frozen=True)
class JobCandidate:
    """One offline job as a round sees it."""

    job_id: int
    mem_bytes: int
    allowed_gpu_types: frozenset[str]
    profiles: dict[str, OfflineFeatures]  # by GPU type
    priority: int = 0
    current_gpu_id: int | None = None
    current_sm_pct: int | None = None
    run_as_user: str | None = None  # the user its processes run as (Slurm: the submitter); None: unknown
    # Solo seconds of work it has left (scheduler_core.jobs.admission orders an overloaded round by it); None: unknown.
    remaining_s: float | None = None
    # False: moving it would cost its progress (it does not checkpoint): once running it stays where it is
    # (scheduler_core.round.plan: kept, never migrated, resized or preempted; only a failing GPU moves it).
    movable: bool = True


class Action(str, enum.Enum):
    START = "start"
    KEEP = "keep"
    MIGRATE = "migrate"
    EVICT = "evict"


@dataclass(frozen=True)
class PlannedPlacement:
    job_id: int
    gpu_id: int
    sm_pct: int
    mem_quota_bytes: int
    predicted_norm_tput: float
    predicted_online_slowdown: float  # the job's part of the GPU's: 1 + its share of the slowdown
    slot: int = 0  # which of the GPU's offline jobs this is (0 = the first; several per GPU, scheduler_core.round.slots)


@dataclass(frozen=True)
class PlanAction:
    action: Action
    job_id: int
    gpu_id: int | None  # target GPU (None for evict)
    from_gpu_id: int | None
    sm_pct: int | None


@dataclass
class RoundResult:
    placements: list[PlannedPlacement]
    actions: list[PlanAction]
    objective: float
    gpus_considered: int
    jobs_considered: int
    feasible_pairs: int
    timings_s: dict[str, float] = field(default_factory=dict)
    # Optimality proof of the matching (scheduler_core.matching.certificate): the plan's
    # matching objective is within optimality_gap_bound of the best possible.
    certified_optimal: bool = False
    optimality_gap_bound: float | None = None
    # Objective the matching maximised: predicted throughput minus migration penalties.
    matching_objective: float | None = None
    stats: dict = field(default_factory=dict)

    def action_counts(self) -> dict[str, int]:
        counts = {a.value: 0 for a in Action}
        for act in self.actions:
            counts[act.action.value] += 1
        return counts
