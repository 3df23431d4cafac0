"""output streams: chunks of dispatches' output at their offsets, per-dispatch acks and digests,
and each tenant's stored bytes

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "dispatches", sa.Column("output_length", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column("dispatches", sa.Column("output_sha256", sa.Text(), nullable=True))
    op.add_column("dispatches", sa.Column("output_purged_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "output_chunks",
        sa.Column("dispatch_id", sa.Text(), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dispatch_id"],
            ["dispatches.dispatch_id"],
            name=op.f("fk_output_chunks_dispatch_id_dispatches"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dispatch_id", "start", name=op.f("pk_output_chunks")),
    )
    # Output is mostly incompressible: store it out of line without trying to compress it.
    op.execute("ALTER TABLE output_chunks ALTER COLUMN data SET STORAGE EXTERNAL")
    op.create_table(
        "tenant_output",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tenant_output")),
    )


def downgrade() -> None:
    op.drop_table("tenant_output")
    op.drop_table("output_chunks")
    op.drop_column("dispatches", "output_purged_at")
    op.drop_column("dispatches", "output_sha256")
    op.drop_column("dispatches", "output_length")
