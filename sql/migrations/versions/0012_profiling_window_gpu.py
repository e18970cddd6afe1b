"""The GPU a profiling window holds: a job is profiled in place, in its own Slurm job on the profile partition
(executors.scheduler.profiling.windows), and a window needs a free GPU of its node. NULL for the runs before, and for a
window waiting for a GPU.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("profiling_runs") as batch:
        batch.add_column(sa.Column("gpu_index", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("profiling_runs") as batch:
        batch.drop_column("gpu_index")
