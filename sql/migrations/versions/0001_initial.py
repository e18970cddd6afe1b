"""Initial feature-store schema: all tables of executors/store/models.py (docs/DESIGN.md §3).

Revision ID: 0001
Revises:
Create Date: 2026-11-21

Generated with autogenerate against an empty SQLite database and cleaned up by
hand. Migrations are frozen in time: literals (check-constraint texts, names)
are spelled out here instead of imported from executors.store.models.
Constraint names are final: op.f() stops Alembic from applying the models'
naming convention (taken from target_metadata) a second time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_types",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("max_sm_clock_mhz", sa.Integer(), nullable=False),
        sa.CheckConstraint("max_sm_clock_mhz > 0", name=op.f("ck_gpu_types_clock_positive")),
        sa.CheckConstraint("memory_bytes > 0", name=op.f("ck_gpu_types_memory_positive")),
        sa.CheckConstraint("sm_count > 0", name=op.f("ck_gpu_types_sm_count_positive")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_gpu_types")),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("created_utc", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    op.create_table(
        "offline_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("job_type", sa.String(length=64), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("mem_bytes", sa.BigInteger(), nullable=False),
        sa.Column("allowed_gpu_types", sa.JSON(), nullable=False),
        sa.Column("checkpoint_dir", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.BigInteger(), nullable=False),
        sa.Column("steps_done", sa.Float(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=True),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint_step", sa.Float(), nullable=False),
        sa.Column("submitted_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_utc", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_utc", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('SUBMITTED', 'PROFILING', 'PENDING', 'RUNNING', 'MIGRATING', 'EVICTED', 'DONE', 'FAILED')", name=op.f("ck_offline_jobs_state_valid")),
        sa.CheckConstraint("mem_bytes > 0", name=op.f("ck_offline_jobs_mem_positive")),
        sa.CheckConstraint("steps_done >= 0", name=op.f("ck_offline_jobs_progress_nonneg")),
        sa.CheckConstraint("total_steps > 0", name=op.f("ck_offline_jobs_steps_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_offline_jobs")),
        sa.UniqueConstraint("slurm_job_id", name=op.f("uq_offline_jobs_slurm_job_id")),
    )
    op.create_index("ix_offline_jobs_state", "offline_jobs", ["state"])
    op.create_table(
        "online_services",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("model_family", sa.String(length=32), nullable=False),
        sa.Column("qps_min", sa.Float(), nullable=False),
        sa.Column("qps_max", sa.Float(), nullable=False),
        sa.Column("peak_hour_utc", sa.Float(), nullable=False),
        sa.Column("latency_slo_ms", sa.Float(), nullable=False),
        sa.Column("slowdown_allowance", sa.Float(), nullable=False),
        sa.Column("mem_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_utc", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("latency_slo_ms > 0", name=op.f("ck_online_services_slo_positive")),
        sa.CheckConstraint("mem_bytes > 0", name=op.f("ck_online_services_mem_positive")),
        sa.CheckConstraint("qps_min >= 0 AND qps_max >= qps_min", name=op.f("ck_online_services_qps_range")),
        sa.CheckConstraint("slowdown_allowance >= 0", name=op.f("ck_online_services_allowance_nonneg")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_online_services")),
        sa.UniqueConstraint("name", name=op.f("uq_online_services_name")),
    )
    op.create_table(
        "scheduling_rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("window_start_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_utc", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("gpus_considered", sa.Integer(), nullable=False),
        sa.Column("jobs_pending", sa.Integer(), nullable=False),
        sa.Column("feasible_pairs", sa.Integer(), nullable=False),
        sa.Column("placements", sa.Integer(), nullable=False),
        sa.Column("objective", sa.Float(), nullable=False),
        sa.Column("predicted_oversold", sa.Float(), nullable=True),
        sa.Column("action_counts", sa.JSON(), nullable=False),
        sa.Column("timings_s", sa.JSON(), nullable=False),
        sa.Column("snapshot", sa.JSON(), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.CheckConstraint("status IN ('planned', 'dispatched', 'failed')", name=op.f("ck_scheduling_rounds_status_valid")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scheduling_rounds")),
        sa.UniqueConstraint("window_start_utc", name=op.f("uq_scheduling_rounds_window_start_utc")),
    )
    op.create_table(
        "colocation_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("service_name", sa.String(length=64), nullable=False),
        sa.Column("job_type", sa.String(length=64), nullable=False),
        sa.Column("online_features", sa.JSON(), nullable=False),
        sa.Column("offline_features", sa.JSON(), nullable=False),
        sa.Column("sm_pct", sa.Float(), nullable=False),
        sa.Column("offline_norm_tput", sa.Float(), nullable=False),
        sa.Column("online_slowdown", sa.Float(), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("collected_utc", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("offline_norm_tput >= 0", name=op.f("ck_colocation_samples_tput_nonneg")),
        sa.CheckConstraint("online_slowdown >= 0", name=op.f("ck_colocation_samples_slowdown_nonneg")),
        sa.CheckConstraint("sm_pct > 0 AND sm_pct <= 100", name=op.f("ck_colocation_samples_sm_pct_range")),
        sa.ForeignKeyConstraint(["gpu_type"], ["gpu_types.name"], name=op.f("fk_colocation_samples_gpu_type_gpu_types")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_colocation_samples")),
    )
    op.create_index(op.f("ix_colocation_samples_gpu_type"), "colocation_samples", ["gpu_type"])
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("health_since_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("overlimit_entries", sa.JSON(), nullable=False),
        sa.CheckConstraint("health IN ('Init', 'Healthy', 'Unhealthy', 'Overlimit', 'Disabled')", name=op.f("ck_gpus_health_valid")),
        sa.CheckConstraint("gpu_index >= 0", name=op.f("ck_gpus_index_nonneg")),
        sa.ForeignKeyConstraint(["gpu_type"], ["gpu_types.name"], name=op.f("fk_gpus_gpu_type_gpu_types")),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_gpus_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
        sa.UniqueConstraint("node_id", "gpu_index", name="uq_gpus_node_index"),
        sa.UniqueConstraint("uuid", name=op.f("uq_gpus_uuid")),
    )
    op.create_table(
        "job_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("gpu_util_pct", sa.Float(), nullable=False),
        sa.Column("sm_activity_pct", sa.Float(), nullable=False),
        sa.Column("sm_occupancy_pct", sa.Float(), nullable=False),
        sa.Column("mem_used_bytes", sa.Float(), nullable=False),
        sa.Column("mem_bw_util_pct", sa.Float(), nullable=False),
        sa.Column("iter_time_s", sa.Float(), nullable=False),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("profiled_utc", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("source IN ('simulated', 'measured')", name=op.f("ck_job_profiles_source_valid")),
        sa.CheckConstraint("iter_time_s > 0", name=op.f("ck_job_profiles_iter_time_positive")),
        sa.ForeignKeyConstraint(["gpu_type"], ["gpu_types.name"], name=op.f("fk_job_profiles_gpu_type_gpu_types")),
        sa.ForeignKeyConstraint(["job_id"], ["offline_jobs.id"], name=op.f("fk_job_profiles_job_id_offline_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_profiles")),
        sa.UniqueConstraint("job_id", "gpu_type", name="uq_job_profiles_job_gpu_type"),
    )
    op.create_table(
        "job_transitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=False),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at_utc", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["offline_jobs.id"], name=op.f("fk_job_transitions_job_id_offline_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_transitions")),
    )
    op.create_index(op.f("ix_job_transitions_job_id"), "job_transitions", ["job_id"])
    op.create_table(
        "predictor_models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("feature_ranges", sa.JSON(), nullable=False),
        sa.Column("n_train", sa.Integer(), nullable=False),
        sa.Column("n_holdout", sa.Integer(), nullable=False),
        sa.Column("holdout_mae_tput", sa.Float(), nullable=False),
        sa.Column("holdout_mae_slowdown", sa.Float(), nullable=False),
        sa.Column("promoted", sa.Boolean(), nullable=False),
        sa.Column("trained_on", sa.String(length=16), nullable=False),
        sa.Column("created_utc", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["gpu_type"], ["gpu_types.name"], name=op.f("fk_predictor_models_gpu_type_gpu_types")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_predictor_models")),
        sa.UniqueConstraint("gpu_type", "version", name="uq_predictor_models_type_version"),
    )
    op.create_table(
        "device_errors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("at_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("xid", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_device_errors_gpu_id_gpus"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_errors")),
    )
    op.create_index(op.f("ix_device_errors_at_utc"), "device_errors", ["at_utc"])
    op.create_index(op.f("ix_device_errors_gpu_id"), "device_errors", ["gpu_id"])
    op.create_table(
        "dispatch_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("action_key", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_utc", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("action IN ('start', 'keep', 'migrate', 'evict')", name=op.f("ck_dispatch_log_action_valid")),
        sa.CheckConstraint("status IN ('intent', 'sent', 'done', 'failed')", name=op.f("ck_dispatch_log_status_valid")),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_dispatch_log_gpu_id_gpus"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["job_id"], ["offline_jobs.id"], name=op.f("fk_dispatch_log_job_id_offline_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["round_id"], ["scheduling_rounds.id"], name=op.f("fk_dispatch_log_round_id_scheduling_rounds"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dispatch_log")),
        sa.UniqueConstraint("action_key", name=op.f("uq_dispatch_log_action_key")),
    )
    op.create_index(op.f("ix_dispatch_log_round_id"), "dispatch_log", ["round_id"])
    op.create_table(
        "evictions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("at_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_evictions_gpu_id_gpus"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["offline_jobs.id"], name=op.f("fk_evictions_job_id_offline_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evictions")),
    )
    op.create_index(op.f("ix_evictions_at_utc"), "evictions", ["at_utc"])
    op.create_index(op.f("ix_evictions_job_id"), "evictions", ["job_id"])
    op.create_table(
        "gpu_metrics_minute",
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("minute_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_util_pct", sa.Float(), nullable=False),
        sa.Column("sm_activity_pct", sa.Float(), nullable=False),
        sa.Column("sm_occupancy_pct", sa.Float(), nullable=False),
        sa.Column("mem_used_bytes", sa.Float(), nullable=False),
        sa.Column("mem_total_bytes", sa.Float(), nullable=False),
        sa.Column("mem_bw_util_pct", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=False),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("online_gpu_util_pct", sa.Float(), nullable=True),
        sa.Column("online_sm_activity_pct", sa.Float(), nullable=True),
        sa.Column("online_mem_used_bytes", sa.Float(), nullable=True),
        sa.Column("online_mem_bw_util_pct", sa.Float(), nullable=True),
        sa.Column("online_qps", sa.Float(), nullable=True),
        sa.Column("online_latency_ms", sa.Float(), nullable=True),
        sa.Column("online_solo_latency_ms", sa.Float(), nullable=True),
        sa.Column("offline_job_id", sa.Integer(), nullable=True),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.CheckConstraint("source IN ('simulated', 'measured')", name=op.f("ck_gpu_metrics_minute_source_valid")),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_gpu_metrics_minute_gpu_id_gpus"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["offline_job_id"], ["offline_jobs.id"], name=op.f("fk_gpu_metrics_minute_offline_job_id_offline_jobs"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("gpu_id", "minute_utc", name=op.f("pk_gpu_metrics_minute")),
    )
    op.create_index("ix_gpu_metrics_minute_minute", "gpu_metrics_minute", ["minute_utc"])
    op.create_table(
        "job_executions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=True),
        sa.Column("start_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sm_pct", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Float(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("solo_equiv_s", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.CheckConstraint("source IN ('simulated', 'measured')", name=op.f("ck_job_executions_source_valid")),
        sa.CheckConstraint("wall_s >= 0 AND solo_equiv_s >= 0", name=op.f("ck_job_executions_times_nonneg")),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_job_executions_gpu_id_gpus"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["offline_jobs.id"], name=op.f("fk_job_executions_job_id_offline_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["round_id"], ["scheduling_rounds.id"], name=op.f("fk_job_executions_round_id_scheduling_rounds"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_executions")),
    )
    op.create_index(op.f("ix_job_executions_job_id"), "job_executions", ["job_id"])
    op.create_index(op.f("ix_job_executions_round_id"), "job_executions", ["round_id"])
    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("sm_pct", sa.Integer(), nullable=False),
        sa.Column("mem_quota_bytes", sa.BigInteger(), nullable=False),
        sa.Column("predicted_norm_tput", sa.Float(), nullable=False),
        sa.Column("predicted_online_slowdown", sa.Float(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.CheckConstraint("action IN ('start', 'keep', 'migrate')", name=op.f("ck_placements_action_valid")),
        sa.CheckConstraint("sm_pct > 0 AND sm_pct <= 100", name=op.f("ck_placements_sm_pct_range")),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_placements_gpu_id_gpus"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["offline_jobs.id"], name=op.f("fk_placements_job_id_offline_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["round_id"], ["scheduling_rounds.id"], name=op.f("fk_placements_round_id_scheduling_rounds"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_placements")),
        sa.UniqueConstraint("round_id", "gpu_id", name="uq_placements_round_gpu"),
        sa.UniqueConstraint("round_id", "job_id", name="uq_placements_round_job"),
    )
    op.create_index(op.f("ix_placements_round_id"), "placements", ["round_id"])
    op.create_table(
        "service_instances",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("service_id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["gpu_id"], ["gpus.id"], name=op.f("fk_service_instances_gpu_id_gpus"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["service_id"], ["online_services.id"], name=op.f("fk_service_instances_service_id_online_services"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_service_instances")),
        sa.UniqueConstraint("gpu_id", name=op.f("uq_service_instances_gpu_id")),
    )


def downgrade() -> None:
    # Children before parents; each table's indexes and constraints go with it.
    op.drop_table("service_instances")
    op.drop_table("placements")
    op.drop_table("job_executions")
    op.drop_table("gpu_metrics_minute")
    op.drop_table("evictions")
    op.drop_table("dispatch_log")
    op.drop_table("device_errors")
    op.drop_table("predictor_models")
    op.drop_table("job_transitions")
    op.drop_table("job_profiles")
    op.drop_table("gpus")
    op.drop_table("colocation_samples")
    op.drop_table("scheduling_rounds")
    op.drop_table("online_services")
    op.drop_table("offline_jobs")
    op.drop_table("nodes")
    op.drop_table("gpu_types")
