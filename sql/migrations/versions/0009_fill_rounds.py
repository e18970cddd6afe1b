"""Fill rounds: placements between the rounds of a window, numbered after the window's round.

A window's round keeps ``seq`` 0; each fill planned in the same window (waiting jobs started on GPUs
that freed up, nothing running moved) is a row of its own with ``seq`` 1, 2, …

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.add_column(sa.Column("seq", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint(op.f("uq_scheduling_rounds_window_start_utc"), type_="unique")
        batch.create_unique_constraint("uq_scheduling_rounds_window_seq", ["window_start_utc", "seq"])
        batch.create_check_constraint(op.f("ck_scheduling_rounds_seq_nonneg"), "seq >= 0")


def downgrade() -> None:
    op.execute("DELETE FROM scheduling_rounds WHERE seq > 0")
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.drop_constraint(op.f("ck_scheduling_rounds_seq_nonneg"), type_="check")
        batch.drop_constraint("uq_scheduling_rounds_window_seq", type_="unique")
        batch.create_unique_constraint(op.f("uq_scheduling_rounds_window_start_utc"), ["window_start_utc"])
        batch.drop_column("seq")
