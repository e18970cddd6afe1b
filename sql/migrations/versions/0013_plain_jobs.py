"""Plain jobs: any training script is a job, whatever its comment says.

- ``offline_jobs.mem_bytes`` and ``total_steps`` may be NULL: not declared (a plain ``sbatch`` with no comment).
  The GPU memory comes from the job's profile (its measured peak); a job with no known steps has no known remaining
  time, which the planner works without.
- ``offline_jobs.checkpointing``: whether the job checkpoints on MuxFlow's signals (SIGUSR1/SIGTERM):
  ``declared`` (its comment says so), ``detected`` (seen handling them in its profiling window), ``none`` (its
  comment says it does not), ``undetected`` (no comment, none seen); a job with ``none`` or ``undetected`` loses
  its progress if moved, so the planner never moves it. NULL: not known yet (or a job made before).
- ``job_profiles.progress_signal``: what measured the job's progress in its profiling window (``runtime``,
  ``optimizer-step``, ``gpu-activity``; NULL for profiles made before, or simulated).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("offline_jobs") as batch:
        batch.drop_constraint(op.f("ck_offline_jobs_mem_positive"), type_="check")
        batch.drop_constraint(op.f("ck_offline_jobs_steps_positive"), type_="check")
        batch.alter_column("mem_bytes", existing_type=sa.BigInteger(), nullable=True)
        batch.alter_column("total_steps", existing_type=sa.BigInteger(), nullable=True)
        batch.create_check_constraint(op.f("ck_offline_jobs_mem_positive"), "mem_bytes IS NULL OR mem_bytes > 0")
        batch.create_check_constraint(op.f("ck_offline_jobs_steps_positive"), "total_steps IS NULL OR total_steps > 0")
        batch.add_column(sa.Column("checkpointing", sa.String(16), nullable=True))
        batch.create_check_constraint(
            op.f("ck_offline_jobs_checkpointing_valid"),
            "checkpointing IS NULL OR checkpointing IN ('declared', 'detected', 'none', 'undetected')")
    with op.batch_alter_table("job_profiles") as batch:
        batch.add_column(sa.Column("progress_signal", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_profiles") as batch:
        batch.drop_column("progress_signal")
    with op.batch_alter_table("offline_jobs") as batch:
        batch.drop_constraint(op.f("ck_offline_jobs_checkpointing_valid"), type_="check")
        batch.drop_column("checkpointing")
        batch.drop_constraint(op.f("ck_offline_jobs_steps_positive"), type_="check")
        batch.drop_constraint(op.f("ck_offline_jobs_mem_positive"), type_="check")
        batch.alter_column("total_steps", existing_type=sa.BigInteger(), nullable=False)
        batch.alter_column("mem_bytes", existing_type=sa.BigInteger(), nullable=False)
        batch.create_check_constraint(op.f("ck_offline_jobs_mem_positive"), "mem_bytes > 0")
        batch.create_check_constraint(op.f("ck_offline_jobs_steps_positive"), "total_steps > 0")
