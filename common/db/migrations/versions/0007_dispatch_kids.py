"""dispatch kids: which dispatch keys each collector was given, so the router signs with one it holds

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("collectors", sa.Column("dispatch_kids", postgresql.ARRAY(sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("collectors", "dispatch_kids")
