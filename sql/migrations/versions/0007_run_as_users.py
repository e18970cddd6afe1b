"""The user each online replica and each offline job runs as (MPS serves one uid per GPU at a time).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("service_instances") as batch:
        batch.add_column(sa.Column("run_as_user", sa.String(length=64), nullable=True))
    with op.batch_alter_table("offline_jobs") as batch:
        batch.add_column(sa.Column("run_as_user", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("offline_jobs") as batch:
        batch.drop_column("run_as_user")
    with op.batch_alter_table("service_instances") as batch:
        batch.drop_column("run_as_user")
