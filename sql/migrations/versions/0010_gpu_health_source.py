"""Who set a GPU's health: its node agent (``node``), or the job-state sync for a node Slurm calls unusable
(``slurm``). The sync turns back to Healthy only the GPUs it marked itself, never a SysMonitor state.

Rows that exist get ``node``: a GPU the sync marked before this revision stays Unhealthy until its node
agent's next state (an agent writes its state when it starts).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.add_column(sa.Column("health_source", sa.String(16), nullable=False, server_default="node"))
        batch.create_check_constraint(op.f("ck_gpus_health_source_valid"), "health_source IN ('node', 'slurm')")


def downgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.drop_constraint(op.f("ck_gpus_health_source_valid"), type_="check")
        batch.drop_column("health_source")
