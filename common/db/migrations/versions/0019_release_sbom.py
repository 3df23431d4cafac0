"""release sbom: a collector release's CycloneDX SBOM and its signed update-repository target

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = (
    ("sbom", sa.LargeBinary()),
    ("sbom_target_name", sa.Text()),
    ("sbom_sha256", sa.Text()),
    ("sbom_length", sa.BigInteger()),
    ("sbom_spec_version", sa.Text()),
    ("sbom_components", sa.Integer()),
)


def upgrade() -> None:
    for name, kind in COLUMNS:
        op.add_column("releases", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("releases", name)
