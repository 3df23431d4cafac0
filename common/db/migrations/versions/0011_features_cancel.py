"""features and cancel: what a task needs of its collector, cancels of running work, and the
protocol version each dispatch was handed out under

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "tasks",
        sa.Column(
            "features",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
    )
    op.add_column(
        "tasks", sa.Column("protocol_floor", sa.Integer(), server_default=sa.text("1"), nullable=False)
    )
    op.add_column("tasks", sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("dispatches", sa.Column("handed_protocol", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("dispatches", "handed_protocol")
    op.drop_column("tasks", "cancel_requested_at")
    op.drop_column("tasks", "protocol_floor")
    op.drop_column("tasks", "features")
