"""Rounds record their optimality certificate; predictor versions their MAPE.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.add_column(sa.Column("certified_optimal", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("optimality_gap_bound", sa.Float(), nullable=True))
        batch.add_column(sa.Column("stats", sa.JSON(), nullable=False, server_default="{}"))
    with op.batch_alter_table("predictor_models") as batch:
        batch.add_column(sa.Column("holdout_mape_tput", sa.Float(), nullable=True))
        batch.add_column(sa.Column("holdout_mape_slowdown", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("predictor_models") as batch:
        batch.drop_column("holdout_mape_slowdown")
        batch.drop_column("holdout_mape_tput")
    with op.batch_alter_table("scheduling_rounds") as batch:
        batch.drop_column("stats")
        batch.drop_column("optimality_gap_bound")
        batch.drop_column("certified_optimal")
