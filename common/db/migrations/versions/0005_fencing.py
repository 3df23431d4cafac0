"""fencing: device leases outlive their envelopes; unknown outcomes wait for the fence

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("device_leases", sa.Column("fenced_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("tasks", sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("tasks", "retry_at")
    op.drop_column("device_leases", "fenced_until")
