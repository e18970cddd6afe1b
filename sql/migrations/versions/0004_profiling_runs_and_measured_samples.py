"""Real profiling: profiling and sampling runs; how each profile and sample was measured.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES = "state IN ('submitted', 'running', 'done', 'failed')"


def _run_columns() -> list[sa.Column]:
    return [
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=True),
        sa.Column("node", sa.String(length=64), nullable=True),
        sa.Column("run_dir", sa.Text(), nullable=False),
    ]


def _times() -> list[sa.Column]:
    return [
        sa.Column("submitted_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_utc", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_utc", sa.DateTime(timezone=True), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "profiling_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        *_run_columns(),
        sa.Column("bound_s", sa.Float(), nullable=False),
        *_times(),
        sa.CheckConstraint(_STATES, name=op.f("ck_profiling_runs_state_valid")),
        sa.CheckConstraint("bound_s > 0", name=op.f("ck_profiling_runs_bound_positive")),
        sa.ForeignKeyConstraint(["gpu_type"], ["gpu_types.name"], name=op.f("fk_profiling_runs_gpu_type_gpu_types")),
        sa.ForeignKeyConstraint(["job_id"], ["offline_jobs.id"], name=op.f("fk_profiling_runs_job_id_offline_jobs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profiling_runs")),
    )
    op.create_index(op.f("ix_profiling_runs_job_id"), "profiling_runs", ["job_id"])
    op.create_index("ix_profiling_runs_state", "profiling_runs", ["state"])
    op.create_table(
        "sampling_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("service_name", sa.String(length=64), nullable=False),
        sa.Column("service_family", sa.String(length=32), nullable=False),
        sa.Column("job_type", sa.String(length=64), nullable=False),
        sa.Column("job_family", sa.String(length=32), nullable=False),
        sa.Column("qps", sa.Float(), nullable=False),
        sa.Column("sm_pcts", sa.JSON(), nullable=False),
        sa.Column("planned_gpu_s", sa.Float(), nullable=False),
        sa.Column("used_gpu_s", sa.Float(), nullable=True),
        *_run_columns(),
        sa.Column("method", sa.String(length=16), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        *_times(),
        sa.CheckConstraint(_STATES, name=op.f("ck_sampling_runs_state_valid")),
        sa.CheckConstraint("qps > 0", name=op.f("ck_sampling_runs_qps_positive")),
        sa.CheckConstraint("planned_gpu_s >= 0", name=op.f("ck_sampling_runs_planned_nonneg")),
        sa.ForeignKeyConstraint(["gpu_type"], ["gpu_types.name"], name=op.f("fk_sampling_runs_gpu_type_gpu_types")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sampling_runs")),
    )
    op.create_index("ix_sampling_runs_state", "sampling_runs", ["state"])
    with op.batch_alter_table("job_profiles") as batch:
        batch.add_column(sa.Column("method", sa.String(length=32), nullable=False, server_default="model"))
        batch.add_column(sa.Column("iterations", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("measured_iter_time_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("iter_time_p50_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("iter_time_p95_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("profiling_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("device", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("slurm_job_id", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("reused_from_job_id", sa.Integer(), nullable=True))
    with op.batch_alter_table("colocation_samples") as batch:
        batch.add_column(sa.Column("online_slowdown_p99", sa.Float(), nullable=True))
        batch.add_column(sa.Column("device", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("qps", sa.Float(), nullable=True))
        batch.add_column(sa.Column("sampling_run_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_colocation_samples_sampling_run_id_sampling_runs"), "sampling_runs",
                                 ["sampling_run_id"], ["id"], ondelete="SET NULL")
        batch.create_index(op.f("ix_colocation_samples_sampling_run_id"), ["sampling_run_id"])


def downgrade() -> None:
    with op.batch_alter_table("colocation_samples") as batch:
        batch.drop_index(op.f("ix_colocation_samples_sampling_run_id"))
        batch.drop_constraint(op.f("fk_colocation_samples_sampling_run_id_sampling_runs"), type_="foreignkey")
        for col in ("sampling_run_id", "qps", "device", "online_slowdown_p99"):
            batch.drop_column(col)
    with op.batch_alter_table("job_profiles") as batch:
        for col in ("reused_from_job_id", "slurm_job_id", "device", "profiling_s", "iter_time_p95_s",
                    "iter_time_p50_s", "measured_iter_time_s", "iterations", "method"):
            batch.drop_column(col)
    op.drop_index("ix_sampling_runs_state", table_name="sampling_runs")
    op.drop_table("sampling_runs")
    op.drop_index("ix_profiling_runs_state", table_name="profiling_runs")
    op.drop_index(op.f("ix_profiling_runs_job_id"), table_name="profiling_runs")
    op.drop_table("profiling_runs")
