"""Feature-store schema (SQLAlchemy 2.0). Migrations in ``sql/migrations`` mirror it.

Times are timezone-aware UTC (`_utc`), sizes in bytes (`_bytes`), percentages
0–100 (`_pct`). Every row that comes from the simulated cluster carries
``source='simulated'`` so that reports can label it.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from scheduler_core.domain import GpuHealth, JobState
from scheduler_core.online.latency_budget import DEFAULT_SLOWDOWN_ALLOWANCE
from scheduler_core.round.clock import DEFAULT_PERIOD_S

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JOB_STATES_SQL = ", ".join(f"'{s.value}'" for s in JobState)
GPU_HEALTH_SQL = ", ".join(f"'{s.value}'" for s in GpuHealth)
SOURCES_SQL = "'simulated', 'measured'"
# job_profiles.method: 'model' (the simulated GPU model, no run), 'nvml' (a profiling run on a GPU,
# NVML metrics), 'simulated-metrics' (a real profiling run on a node without a GPU: iterations
# measured, GPU metrics from the simulated model), 'reused' (copied from a job of the same type).
PROFILE_METHODS = ("model", "nvml", "simulated-metrics", "reused")
# colocation_samples.method: 'simulated', 'mps' / 'no-mps' (measured on a GPU with / without MPS),
# 'cpu' (the harness ran both workloads on a CPU: a test of the harness, never training data).
SAMPLE_METHODS = ("simulated", "mps", "no-mps", "cpu")
NOT_TRAINING_METHODS = ("cpu",)
RUN_STATES = ("submitted", "running", "done", "failed")
RUN_STATES_SQL = ", ".join(f"'{x}'" for x in RUN_STATES)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class _UtcDateTime(TypeDecorator):
    """A timestamp that is timezone-aware UTC both ways, whatever the database keeps.

    SQLite stores the text of the time without its zone and gives back a naive
    datetime; PostgreSQL gives it back in the session's zone. Either way the model sees
    UTC with its tzinfo, so no reader re-attaches one. A naive value written is taken as UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    @staticmethod
    def _utc(value: dt.datetime | None) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)

    def process_bind_param(self, value, dialect):
        return self._utc(value)

    def process_result_value(self, value, dialect):
        return self._utc(value)


UtcDateTime = _UtcDateTime()


class GpuType(Base):
    __tablename__ = "gpu_types"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    sm_count: Mapped[int] = mapped_column(Integer)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    max_sm_clock_mhz: Mapped[int] = mapped_column(Integer)
    __table_args__ = (
        CheckConstraint("sm_count > 0", name="sm_count_positive"),
        CheckConstraint("memory_bytes > 0", name="memory_positive"),
        CheckConstraint("max_sm_clock_mhz > 0", name="clock_positive"),
    )


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    created_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    gpus: Mapped[list[Gpu]] = relationship(back_populates="node", order_by="Gpu.gpu_index")


# gpus.health_source: who set a GPU's health — its node agent, or the job-state sync for a node Slurm calls unusable
HEALTH_BY_AGENT, HEALTH_BY_SLURM = "node", "slurm"


class Gpu(Base):
    __tablename__ = "gpus"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    gpu_index: Mapped[int] = mapped_column(Integer)
    gpu_type: Mapped[str] = mapped_column(ForeignKey("gpu_types.name"))
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    health: Mapped[str] = mapped_column(String(16), default=GpuHealth.INIT.value)
    health_since_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    # Who set ``health``: the GPU's node agent (SysMonitor, device errors) or ``slurm`` (the job-state sync,
    # for a node Slurm calls unusable). The sync turns back only what it set (executors.scheduler.slurm.node_faults).
    health_source: Mapped[str] = mapped_column(String(16), default=HEALTH_BY_AGENT, server_default=HEALTH_BY_AGENT)
    overlimit_entries: Mapped[list] = mapped_column(JSON, default=list)  # UTC ISO times, last 2 h
    node: Mapped[Node] = relationship(back_populates="gpus")
    __table_args__ = (
        UniqueConstraint("node_id", "gpu_index", name="uq_gpus_node_index"),
        CheckConstraint(f"health IN ({GPU_HEALTH_SQL})", name="health_valid"),
        CheckConstraint(f"health_source IN ('{HEALTH_BY_AGENT}', '{HEALTH_BY_SLURM}')", name="health_source_valid"),
        CheckConstraint("gpu_index >= 0", name="index_nonneg"),
    )


class OnlineService(Base):
    __tablename__ = "online_services"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    model_family: Mapped[str] = mapped_column(String(32))
    qps_min: Mapped[float] = mapped_column(Float)
    qps_max: Mapped[float] = mapped_column(Float)
    peak_hour_utc: Mapped[float] = mapped_column(Float, default=20.0)
    latency_slo_ms: Mapped[float] = mapped_column(Float)
    slowdown_allowance: Mapped[float] = mapped_column(Float, default=DEFAULT_SLOWDOWN_ALLOWANCE)
    # The mean slowdown of its requests it accepts over the day (scheduler_core.online.latency_budget, paced by
    # scheduler_core.online.budget_pacing), the allowance then its per-minute cap; NULL: the flat allowance on every
    # minute. (Registration gives DEFAULT_SLOWDOWN_BUDGET unless told otherwise: executors.store.inventory.)
    slowdown_budget: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    mem_bytes: Mapped[int] = mapped_column(BigInteger)
    created_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    __table_args__ = (
        CheckConstraint("qps_min >= 0 AND qps_max >= qps_min", name="qps_range"),
        CheckConstraint("latency_slo_ms > 0", name="slo_positive"),
        CheckConstraint("slowdown_allowance >= 0", name="allowance_nonneg"),
        CheckConstraint("slowdown_budget IS NULL OR slowdown_budget >= 0", name="budget_nonneg"),
        CheckConstraint("mem_bytes > 0", name="mem_positive"),
    )


class ServiceInstance(Base):
    """Where an online service runs: one replica per GPU (paper §3)."""

    __tablename__ = "service_instances"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("online_services.id", ondelete="CASCADE"))
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), unique=True)
    # The replica's Prometheus endpoint (reference service: executors/job/workloads/endpoint.py), scraped
    # by the node agent for the replica's request rate and latency; NULL: not registered.
    metrics_url: Mapped[str | None] = mapped_column(String(512), nullable=True)
    # The user the replica's processes run as. MPS serves one uid per GPU at a time, so only offline
    # jobs of this user share the GPU (docs/SLURM.md "Several users on one GPU"); NULL: any user's.
    run_as_user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    service: Mapped[OnlineService] = relationship()
    gpu: Mapped[Gpu] = relationship()


class OfflineJob(Base):
    __tablename__ = "offline_jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    job_type: Mapped[str] = mapped_column(String(64))
    command: Mapped[str] = mapped_column(Text)
    # GPU memory the job needs; NULL: not declared (a plain sbatch): its profile's measured peak decides.
    mem_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    allowed_gpu_types: Mapped[list] = mapped_column(JSON)
    checkpoint_dir: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # NULL: unknown
    steps_done: Mapped[float] = mapped_column(Float, default=0.0)
    state: Mapped[str] = mapped_column(String(16), default=JobState.SUBMITTED.value)
    state_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True, unique=True)
    checkpoint_step: Mapped[float] = mapped_column(Float, default=0.0)
    # The cluster's exit code of the job's last run (Slurm: the batch script's), once it ended.
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The user the job's processes run as (Slurm: the submitting user); NULL: unknown, placed anywhere.
    run_as_user: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Whether it checkpoints on MuxFlow's signals (SIGUSR1/SIGTERM): 'declared' or 'none' (its comment says),
    # 'detected' (seen catching them in its profiling window), 'undetected' (not seen). A job with 'none' or
    # 'undetected' loses its progress if moved: never moved. NULL: not known yet.
    checkpointing: Mapped[str | None] = mapped_column(String(16), nullable=True)
    submitted_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_utc: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    finished_utc: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    __table_args__ = (
        CheckConstraint(f"state IN ({JOB_STATES_SQL})", name="state_valid"),
        CheckConstraint("mem_bytes IS NULL OR mem_bytes > 0", name="mem_positive"),
        CheckConstraint("total_steps IS NULL OR total_steps > 0", name="steps_positive"),
        CheckConstraint("checkpointing IS NULL OR checkpointing IN ('declared', 'detected', 'none', 'undetected')",
                        name="checkpointing_valid"),
        CheckConstraint("steps_done >= 0", name="progress_nonneg"),
        Index("ix_offline_jobs_state", "state"),
    )


class JobTransition(Base):
    """Audit trail of every stored state change."""

    __tablename__ = "job_transitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("offline_jobs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    at_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)


class JobProfile(Base):
    """Solo features of an offline job on one GPU type (docs/DESIGN.md §5)."""

    __tablename__ = "job_profiles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("offline_jobs.id", ondelete="CASCADE"))
    gpu_type: Mapped[str] = mapped_column(ForeignKey("gpu_types.name"))
    gpu_util_pct: Mapped[float] = mapped_column(Float)
    sm_activity_pct: Mapped[float] = mapped_column(Float)
    sm_occupancy_pct: Mapped[float] = mapped_column(Float)
    mem_used_bytes: Mapped[float] = mapped_column(Float)
    mem_bw_util_pct: Mapped[float] = mapped_column(Float)
    iter_time_s: Mapped[float] = mapped_column(Float)
    sm_clock_mhz: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))
    profiled_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    # How the profile was made (PROFILE_METHODS) and what the profiling run measured.
    method: Mapped[str] = mapped_column(String(32), default="model", server_default="model")
    iterations: Mapped[int | None] = mapped_column(Integer, nullable=True)
    measured_iter_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # mean, on `device`
    iter_time_p50_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    iter_time_p95_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    profiling_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # wall time of the profiling run
    device: Mapped[str | None] = mapped_column(String(128), nullable=True)
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # the profiling copy
    reused_from_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What measured the job's progress in its profiling window: 'runtime', 'optimizer-step', 'gpu-activity'.
    progress_signal: Mapped[str | None] = mapped_column(String(32), nullable=True)
    __table_args__ = (
        UniqueConstraint("job_id", "gpu_type", name="uq_job_profiles_job_gpu_type"),
        CheckConstraint(f"source IN ({SOURCES_SQL})", name="source_valid"),
        CheckConstraint("iter_time_s > 0", name="iter_time_positive"),
    )


class GpuMetricMinute(Base):
    """Per-minute aggregate of one GPU's monitor samples (raw samples stay on the node)."""

    __tablename__ = "gpu_metrics_minute"
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True)
    minute_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, primary_key=True)
    gpu_util_pct: Mapped[float] = mapped_column(Float)
    sm_activity_pct: Mapped[float] = mapped_column(Float)
    sm_occupancy_pct: Mapped[float] = mapped_column(Float)
    mem_used_bytes: Mapped[float] = mapped_column(Float)
    mem_total_bytes: Mapped[float] = mapped_column(Float)
    mem_bw_util_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    sm_clock_mhz: Mapped[float] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    temperature_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The online service's own share (per-process accounting), what forecasts use.
    online_gpu_util_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    online_sm_activity_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    online_mem_used_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    online_mem_bw_util_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    online_qps: Mapped[float | None] = mapped_column(Float, nullable=True)
    online_latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)  # average
    online_solo_latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    online_latency_p99_ms: Mapped[float | None] = mapped_column(Float, nullable=True)  # node agent: from the endpoint
    offline_job_id: Mapped[int | None] = mapped_column(
        ForeignKey("offline_jobs.id", ondelete="SET NULL"), nullable=True
    )
    # Why online columns of this row are NULL (endpoint down, no per-process accounting, …);
    # NULL when every online column has a value (docs/NODE_AGENT.md "Online columns").
    online_gap_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    health: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))
    __table_args__ = (
        CheckConstraint(f"source IN ({SOURCES_SQL})", name="source_valid"),
        Index("ix_gpu_metrics_minute_minute", "minute_utc"),
    )


class ColocationSample(Base):
    """One measured (or simulated) co-location: the predictor's training data (paper §6)."""

    __tablename__ = "colocation_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_type: Mapped[str] = mapped_column(ForeignKey("gpu_types.name"), index=True)
    service_name: Mapped[str] = mapped_column(String(64))
    job_type: Mapped[str] = mapped_column(String(64))
    online_features: Mapped[dict] = mapped_column(JSON)
    offline_features: Mapped[dict] = mapped_column(JSON)
    sm_pct: Mapped[float] = mapped_column(Float)
    offline_norm_tput: Mapped[float] = mapped_column(Float)
    online_slowdown: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(String(16))  # SAMPLE_METHODS
    collected_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    # Measured samples: p99 slowdown next to the average one, the device, the load.
    online_slowdown_p99: Mapped[float | None] = mapped_column(Float, nullable=True)
    device: Mapped[str | None] = mapped_column(String(128), nullable=True)
    qps: Mapped[float | None] = mapped_column(Float, nullable=True)
    sampling_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("sampling_runs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    __table_args__ = (
        CheckConstraint("sm_pct > 0 AND sm_pct <= 100", name="sm_pct_range"),
        CheckConstraint("offline_norm_tput >= 0", name="tput_nonneg"),
        CheckConstraint("online_slowdown >= 0", name="slowdown_nonneg"),
    )


class RunRecord:
    """Columns every profiling or sampling run has: its state, where it ran, when, and its report."""

    state: Mapped[str] = mapped_column(String(16), default="submitted")
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    node: Mapped[str | None] = mapped_column(String(64), nullable=True)
    run_dir: Mapped[str] = mapped_column(Text)
    submitted_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_utc: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    finished_utc: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    report: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class ProfilingRun(RunRecord, Base):
    """One solo-profiling run of an offline job on one GPU type (paper §6).

    Written before the run is submitted and updated as it goes, so a profiler that
    restarts finds runs in flight instead of submitting them twice.
    """

    __tablename__ = "profiling_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("offline_jobs.id", ondelete="CASCADE"), index=True)
    gpu_type: Mapped[str] = mapped_column(ForeignKey("gpu_types.name"))
    bound_s: Mapped[float] = mapped_column(Float)
    # The GPU (on ``node``) a profiling window of the job's own Slurm job holds (executors.scheduler.profiling.windows).
    gpu_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    __table_args__ = (
        CheckConstraint(f"state IN ({RUN_STATES_SQL})", name="state_valid"),
        CheckConstraint("bound_s > 0", name="bound_positive"),
        Index("ix_profiling_runs_state", "state"),
    )


class SamplingRun(RunRecord, Base):
    """One co-location measurement session: a service at a QPS and a job over a list of SM %."""

    __tablename__ = "sampling_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_type: Mapped[str] = mapped_column(ForeignKey("gpu_types.name"))
    service_name: Mapped[str] = mapped_column(String(64))
    service_family: Mapped[str] = mapped_column(String(32))
    job_type: Mapped[str] = mapped_column(String(64))
    job_family: Mapped[str] = mapped_column(String(32))
    qps: Mapped[float] = mapped_column(Float)
    sm_pcts: Mapped[list] = mapped_column(JSON)
    planned_gpu_s: Mapped[float] = mapped_column(Float)
    used_gpu_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    method: Mapped[str | None] = mapped_column(String(16), nullable=True)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    __table_args__ = (
        CheckConstraint(f"state IN ({RUN_STATES_SQL})", name="state_valid"),
        CheckConstraint("qps > 0", name="qps_positive"),
        CheckConstraint("planned_gpu_s >= 0", name="planned_nonneg"),
        Index("ix_sampling_runs_state", "state"),
    )


class PredictorModel(Base):
    __tablename__ = "predictor_models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_type: Mapped[str] = mapped_column(ForeignKey("gpu_types.name"))
    version: Mapped[int] = mapped_column(Integer)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    config: Mapped[dict] = mapped_column(JSON)
    feature_ranges: Mapped[dict] = mapped_column(JSON)
    n_train: Mapped[int] = mapped_column(Integer)
    n_holdout: Mapped[int] = mapped_column(Integer)
    holdout_mae_tput: Mapped[float] = mapped_column(Float)
    holdout_mae_slowdown: Mapped[float] = mapped_column(Float)
    holdout_mape_tput: Mapped[float | None] = mapped_column(Float, nullable=True)
    holdout_mape_slowdown: Mapped[float | None] = mapped_column(Float, nullable=True)
    promoted: Mapped[bool] = mapped_column(Boolean, default=False)
    trained_on: Mapped[str] = mapped_column(String(16))  # simulated | measured | mixed
    created_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    __table_args__ = (UniqueConstraint("gpu_type", "version", name="uq_predictor_models_type_version"),)


class SchedulingRound(Base):
    __tablename__ = "scheduling_rounds"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    window_start_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    # 0: the window's round; 1, 2, …: fills of the window (waiting jobs started on GPUs that freed up between
    # rounds, nothing running moved; executors.scheduler.round_runner.plan_fill).
    seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Length of the round's window (the round period in force when it was planned).
    period_s: Mapped[int] = mapped_column(Integer, default=DEFAULT_PERIOD_S, server_default=str(DEFAULT_PERIOD_S))
    started_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    finished_utc: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="planned")
    gpus_considered: Mapped[int] = mapped_column(Integer, default=0)
    jobs_pending: Mapped[int] = mapped_column(Integer, default=0)
    feasible_pairs: Mapped[int] = mapped_column(Integer, default=0)
    placements: Mapped[int] = mapped_column(Integer, default=0)
    objective: Mapped[float] = mapped_column(Float, default=0.0)
    predicted_oversold: Mapped[float | None] = mapped_column(Float, nullable=True)
    action_counts: Mapped[dict] = mapped_column(JSON, default=dict)
    timings_s: Mapped[dict] = mapped_column(JSON, default=dict)
    snapshot: Mapped[dict] = mapped_column(JSON, default=dict)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    # The plan diff as dispatched: [{"action", "job_id", "gpu_id", "from_gpu_id", "sm_pct"}, ...]
    plan_actions: Mapped[list] = mapped_column(JSON, default=list)
    # The matching's optimality proof (dual certificate checked on every feasible pair).
    certified_optimal: Mapped[bool] = mapped_column(Boolean, default=False)
    optimality_gap_bound: Mapped[float | None] = mapped_column(Float, nullable=True)
    stats: Mapped[dict] = mapped_column(JSON, default=dict)  # solver and pair-building figures
    __table_args__ = (
        CheckConstraint("status IN ('planned', 'dispatched', 'failed')", name="status_valid"),
        CheckConstraint("seq >= 0", name="seq_nonneg"),
        UniqueConstraint("window_start_utc", "seq", name="uq_scheduling_rounds_window_seq"),
    )


class Placement(Base):
    __tablename__ = "placements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("scheduling_rounds.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("offline_jobs.id", ondelete="CASCADE"))
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    sm_pct: Mapped[int] = mapped_column(Integer)
    mem_quota_bytes: Mapped[int] = mapped_column(BigInteger)
    predicted_norm_tput: Mapped[float] = mapped_column(Float)
    predicted_online_slowdown: Mapped[float] = mapped_column(Float)
    action: Mapped[str] = mapped_column(String(16))
    # Which of its GPU's offline jobs this is (several per GPU, scheduler_core.round.slots): one job per slot.
    slot: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    __table_args__ = (
        UniqueConstraint("round_id", "job_id", name="uq_placements_round_job"),
        UniqueConstraint("round_id", "gpu_id", "slot", name="uq_placements_round_gpu_slot"),
        CheckConstraint("slot >= 0", name="slot_nonneg"),
        CheckConstraint("sm_pct > 0 AND sm_pct <= 100", name="sm_pct_range"),
        CheckConstraint("action IN ('start', 'keep', 'migrate')", name="action_valid"),
    )


class DispatchLog(Base):
    """Intent written before an action is sent, result after (idempotent dispatch)."""

    __tablename__ = "dispatch_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("scheduling_rounds.id", ondelete="CASCADE"), index=True)
    action_key: Mapped[str] = mapped_column(String(128), unique=True)
    action: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[int] = mapped_column(ForeignKey("offline_jobs.id", ondelete="CASCADE"))
    gpu_id: Mapped[int | None] = mapped_column(ForeignKey("gpus.id", ondelete="SET NULL"), nullable=True)
    payload: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="intent")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
    __table_args__ = (
        CheckConstraint("status IN ('intent', 'sent', 'done', 'failed')", name="status_valid"),
        CheckConstraint("action IN ('start', 'keep', 'migrate', 'evict')", name="action_valid"),
    )


class JobExecution(Base):
    """A stretch of time an offline job ran on one GPU: the basis of oversold GPU (§9)."""

    __tablename__ = "job_executions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("offline_jobs.id", ondelete="CASCADE"), index=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    round_id: Mapped[int | None] = mapped_column(
        ForeignKey("scheduling_rounds.id", ondelete="SET NULL"), nullable=True, index=True
    )
    start_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    end_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    sm_pct: Mapped[int] = mapped_column(Integer)
    steps: Mapped[float] = mapped_column(Float)
    wall_s: Mapped[float] = mapped_column(Float)
    solo_equiv_s: Mapped[float] = mapped_column(Float)  # time the same steps take alone
    source: Mapped[str] = mapped_column(String(16))
    __table_args__ = (
        CheckConstraint("wall_s >= 0 AND solo_equiv_s >= 0", name="times_nonneg"),
        CheckConstraint(f"source IN ({SOURCES_SQL})", name="source_valid"),
    )


class Eviction(Base):
    __tablename__ = "evictions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("offline_jobs.id", ondelete="CASCADE"), index=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    at_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    reason: Mapped[str] = mapped_column(Text)
    health: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))


class DeviceError(Base):
    __tablename__ = "device_errors"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), index=True)
    at_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, index=True)
    kind: Mapped[str] = mapped_column(String(32))  # xid | mps_server_crash | mps_hang | ...
    xid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    source: Mapped[str] = mapped_column(String(16))


class SimulatedClusterState(Base):
    """The simulated cluster's node-agent state between rounds (one row per cluster).

    A real cluster keeps this on its nodes; the simulated one keeps it here so
    that any process — the main job, a Dagster run launched from the UI, the
    CLI — picks the simulation up exactly where the last one left it.
    """

    __tablename__ = "simulated_cluster_state"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    observed_until_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    state: Mapped[dict] = mapped_column(JSON)
    updated_utc: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utcnow)
