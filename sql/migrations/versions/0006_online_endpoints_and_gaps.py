"""Online replicas register their metrics endpoint; minute rows keep the replica's p99 latency and why an online column is missing.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("service_instances") as batch:
        batch.add_column(sa.Column("metrics_url", sa.String(length=512), nullable=True))
    with op.batch_alter_table("gpu_metrics_minute") as batch:
        batch.add_column(sa.Column("online_latency_p99_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("online_gap_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_metrics_minute") as batch:
        batch.drop_column("online_gap_reason")
        batch.drop_column("online_latency_p99_ms")
    with op.batch_alter_table("service_instances") as batch:
        batch.drop_column("metrics_url")
