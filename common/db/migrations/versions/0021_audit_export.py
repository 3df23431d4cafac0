"""audit export: each audit row's transaction id (the export's commit order) and one cursor per sink

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Rows written before this migration share its transaction id: they are exported first, in id order.
    op.add_column(
        "audit_events",
        sa.Column(
            "xid",
            sa.BigInteger(),
            nullable=False,
            server_default=sa.text("(pg_current_xact_id()::text)::bigint"),
        ),
    )
    op.create_index("ix_audit_events_xid_id", "audit_events", ["xid", "id"])
    op.create_table(
        "audit_export_cursors",
        sa.Column("sink", sa.Text(), nullable=False),
        sa.Column("xid", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("event_id", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("delivered", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink", name=op.f("pk_audit_export_cursors")),
    )


def downgrade() -> None:
    op.drop_table("audit_export_cursors")
    op.drop_index("ix_audit_events_xid_id", table_name="audit_events")
    op.drop_column("audit_events", "xid")
