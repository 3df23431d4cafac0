"""report signature: the collector's signature over each dispatch's report, kept as evidence

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("dispatches", sa.Column("report_signature", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("dispatches", "report_signature")
