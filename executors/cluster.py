"""The cluster interface the scheduler dispatches to.

Two implementations carry it: the simulated cluster (``executors.simulated``),
which is what runs on machines without GPUs, and the Slurm dispatcher. Both
receive the same plan actions from the same round code.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Protocol

from scheduler_core.domain import PlanAction


@dataclass(frozen=True)
class DispatchResult:
    action: PlanAction
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class RunningJob:
    job_id: int
    gpu_id: int
    sm_pct: int


@dataclass
class MetricRow:
    gpu_id: int
    minute_utc: dt.datetime
    gpu_util_pct: float
    sm_activity_pct: float
    sm_occupancy_pct: float
    mem_used_bytes: float
    mem_total_bytes: float
    mem_bw_util_pct: float | None
    sm_clock_mhz: float
    power_w: float | None
    temperature_c: float | None
    online_gpu_util_pct: float | None
    online_sm_activity_pct: float | None
    online_mem_used_bytes: float | None
    online_mem_bw_util_pct: float | None
    online_qps: float | None
    online_latency_ms: float | None
    online_solo_latency_ms: float | None
    offline_job_id: int | None  # the offline job on the GPU (of several, the one with the largest share)
    health: str


@dataclass(frozen=True)
class ExecutionRecord:
    job_id: int
    gpu_id: int
    start_utc: dt.datetime
    end_utc: dt.datetime
    sm_pct: int
    steps: float
    wall_s: float
    solo_equiv_s: float


@dataclass(frozen=True)
class EvictionRecord:
    job_id: int
    gpu_id: int
    at_utc: dt.datetime
    reason: str
    health: str
    steps_lost: float


@dataclass
class IntervalReport:
    """What the cluster observed while time passed: the node agents' reports."""

    metrics: list[MetricRow] = field(default_factory=list)
    executions: list[ExecutionRecord] = field(default_factory=list)
    evictions: list[EvictionRecord] = field(default_factory=list)
    completed: dict[int, dt.datetime] = field(default_factory=dict)
    progress: dict[int, tuple[float, float]] = field(default_factory=dict)  # job → (steps_done, checkpoint_step)
    health: dict[int, str] = field(default_factory=dict)  # gpu → SysMonitor state at the end


@dataclass
class JobSyncReport:
    """What one job-state synchronisation changed (executors.scheduler.slurm.sync; the simulated cluster's requeue)."""

    transitions: dict[str, int] = field(default_factory=dict)  # target state → count
    held: list[int] = field(default_factory=list)              # cluster job ids held by the sync
    made_eligible: list[int] = field(default_factory=list)     # placed jobs the cluster had delayed, made eligible
    executions: int = 0
    skipped_in_flight: int = 0
    moved_meanwhile: int = 0  # jobs whose store state changed while Slurm was asked: left to the next call
    errors: list[str] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return sum(self.transitions.values()) + len(self.held) + len(self.made_eligible)

    def count(self, target: str, n: int = 1) -> None:
        self.transitions[target] = self.transitions.get(target, 0) + n


class Cluster(Protocol):
    simulated: bool
    # True when a dispatched START runs at once (the simulated cluster); False when the cluster starts
    # released jobs itself later (Slurm), so a placed job is PLACED until the job-state sync sees it run.
    starts_jobs_at_once: bool

    def dispatch(self, actions: list[PlanAction], now_utc: dt.datetime) -> list[DispatchResult]:
        """Carry out plan actions. Idempotent per action: repeating one changes nothing."""
        ...

    def running(self) -> dict[int, RunningJob]:
        ...


class Profiler(Protocol):
    """Where offline jobs are profiled and co-location samples measured (paper §6): the predictor's inputs.

    Slurm: ``executors.scheduler.profiling.backend.SlurmProfiler`` (the profile partition); the simulated
    cluster's backend is its own profiler (its GPU model).
    """

    simulated: bool  # profiles and samples from a model, not from runs

    def profile_new_jobs(self, store, seed: int) -> int:
        """Solo-profile newly submitted offline jobs; return how many were profiled."""
        ...

    def collect_samples(self, store, per_type: int, seed: int) -> dict[str, int]:
        """Top each GPU type's co-location samples up to ``per_type``; return how many were added."""
        ...


SIMULATED_STEP_S = 60  # the simulated cluster advances a minute at a time


def round_period_error(period_s: int, simulated: bool) -> str | None:
    """Why a round period does not suit a cluster, or None: the one check the settings and the round service make.
    The simulated cluster steps whole minutes; a real one takes any period the round clock accepts."""
    if simulated and period_s % SIMULATED_STEP_S:
        return (f"the simulated cluster steps whole minutes: the round period must be a multiple of "
                f"{SIMULATED_STEP_S} s, got {period_s} s")
    return None


class ClusterBackend(Protocol):
    """A cluster as the pipeline dispatches to and observes it across processes: every call works from the store.

    The Dagster cluster resource hands out one of these (simulated or Slurm);
    the CLI and the main job use the same ones.
    """

    simulated: bool
    source: str  # label of the rows it produces: 'simulated' | 'measured'

    def cluster(self, store) -> Cluster:
        """The live cluster, for reading what runs now."""
        ...

    def sync_jobs(self, store, now: dt.datetime) -> JobSyncReport:
        """Make the store's job states follow the cluster (started, finished, requeued, evicted → queue)."""
        ...

    def ensure_history(self, store, window_start: dt.datetime) -> int:
        """Make sure online load history exists before ``window_start``; return minutes recorded now."""
        ...

    def dispatch(self, store, round_id: int, result, now: dt.datetime) -> tuple[int, int]:
        """Carry out a stored round's plan; (ok, failed). Idempotent."""
        ...

    def observe(self, store, window_start: dt.datetime, minutes: int, round_id: int | None) -> IntervalReport | None:
        """Book what the cluster reported for the window; None if it was booked before."""
        ...
