"""trace context: the W3C traceparent a task and each of its dispatches continue (tracing on only)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | None = None
depends_on: str | None = None

TABLES = ("tasks", "dispatches")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("traceparent", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_column(table, "traceparent")
