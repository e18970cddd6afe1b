"""Simulated cluster state between rounds; each round's plan diff.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "simulated_cluster_state",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("observed_until_utc", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("updated_utc", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_simulated_cluster_state")),
    )
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.add_column(sa.Column("plan_actions", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.drop_column("plan_actions")
    op.drop_table("simulated_cluster_state")
