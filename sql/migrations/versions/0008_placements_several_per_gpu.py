"""Several offline jobs per GPU: a placement's slot on its GPU replaces one placement per GPU per round.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("slot", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("uq_placements_round_gpu", type_="unique")
        batch.create_unique_constraint("uq_placements_round_gpu_slot", ["round_id", "gpu_id", "slot"])
        batch.create_check_constraint(op.f("ck_placements_slot_nonneg"), "slot >= 0")


def downgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.drop_constraint(op.f("ck_placements_slot_nonneg"), type_="check")
        batch.drop_constraint("uq_placements_round_gpu_slot", type_="unique")
        batch.create_unique_constraint("uq_placements_round_gpu", ["round_id", "gpu_id"])
        batch.drop_column("slot")
