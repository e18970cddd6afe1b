"""An online service's slowdown budget: the mean slowdown of its requests it accepts over the day
(``scheduler_core.online.latency_budget``); NULL, as every existing service gets, keeps the flat allowance.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("online_services") as batch:
        batch.add_column(sa.Column("slowdown_budget", sa.Float(), nullable=True))
        batch.create_check_constraint(op.f("ck_online_services_budget_nonneg"),
                                      "slowdown_budget IS NULL OR slowdown_budget >= 0")


def downgrade() -> None:
    with op.batch_alter_table("online_services") as batch:
        batch.drop_constraint(op.f("ck_online_services_budget_nonneg"), type_="check")
        batch.drop_column("slowdown_budget")
