"""relayed credentials: the device credential a vault mode B dispatch carries, encrypted to its
collector and signed

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("dispatches", sa.Column("relayed_credential", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("dispatches", "relayed_credential")
