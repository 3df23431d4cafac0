"""key material: the deployment's key and CA material, anchored (local) or sealed (shared)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "key_material",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("material_id", sa.Text(), nullable=False),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("sealed_with", sa.Text(), nullable=True),
        sa.Column("sealed", sa.LargeBinary(), nullable=True),
        sa.Column("public", sa.LargeBinary(), nullable=True),
        sa.Column("summary", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("mode IN ('local', 'shared')", name=op.f("ck_key_material_mode")),
        sa.CheckConstraint(
            "mode = 'local' OR (sealed IS NOT NULL AND sealed_with IS NOT NULL AND public IS NOT NULL)",
            name=op.f("ck_key_material_sealed"),
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_key_material")),
    )


def downgrade() -> None:
    op.drop_table("key_material")
