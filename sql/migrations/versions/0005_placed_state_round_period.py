"""Jobs can be PLACED (released on their GPU, not started yet) and keep their last exit code; rounds record their period.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "('SUBMITTED', 'PROFILING', 'PENDING', 'RUNNING', 'MIGRATING', 'EVICTED', 'DONE', 'FAILED')"
_NEW = "('SUBMITTED', 'PROFILING', 'PENDING', 'PLACED', 'RUNNING', 'MIGRATING', 'EVICTED', 'DONE', 'FAILED')"


def _states(values: str) -> None:
    with op.batch_alter_table("offline_jobs") as batch:
        batch.drop_constraint(op.f("ck_offline_jobs_state_valid"), type_="check")
        batch.create_check_constraint(op.f("ck_offline_jobs_state_valid"), f"state IN {values}")


def upgrade() -> None:
    _states(_NEW)
    with op.batch_alter_table("offline_jobs") as batch:
        batch.add_column(sa.Column("exit_code", sa.Integer(), nullable=True))
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.add_column(sa.Column("period_s", sa.Integer(), nullable=False, server_default="900"))


def downgrade() -> None:
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.drop_column("period_s")
    with op.batch_alter_table("offline_jobs") as batch:
        batch.drop_column("exit_code")
    op.execute("UPDATE offline_jobs SET state = 'PENDING' WHERE state = 'PLACED'")
    _states(_OLD)
