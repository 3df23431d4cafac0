"""credential revocations: credentials taken back from running tasks, per collector

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "credential_revocations",
        sa.Column("revocation_id", sa.Text(), nullable=False),
        sa.Column("credential_ref", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("action IN ('scrub', 'kill')", name=op.f("ck_credential_revocations_action")),
        sa.PrimaryKeyConstraint("revocation_id", name=op.f("pk_credential_revocations")),
    )
    op.create_index(
        op.f("ix_credential_revocations_credential_ref_created_at"),
        "credential_revocations",
        ["credential_ref", "created_at"],
    )
    op.create_table(
        "revocation_targets",
        sa.Column("revocation_id", sa.Text(), nullable=False),
        sa.Column("collector_id", sa.Text(), nullable=False),
        sa.Column("dispatch_ids", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("results", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("detail", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(
            "state IN ('pending', 'revoked', 'unreachable', 'failed')",
            name=op.f("ck_revocation_targets_state"),
        ),
        sa.ForeignKeyConstraint(
            ["revocation_id"],
            ["credential_revocations.revocation_id"],
            name=op.f("fk_revocation_targets_revocation_id_credential_revocations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("revocation_id", "collector_id", name=op.f("pk_revocation_targets")),
    )
    op.create_index(
        op.f("ix_revocation_targets_collector_id_state"), "revocation_targets", ["collector_id", "state"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_revocation_targets_collector_id_state"), table_name="revocation_targets")
    op.drop_table("revocation_targets")
    op.drop_index(
        op.f("ix_credential_revocations_credential_ref_created_at"), table_name="credential_revocations"
    )
    op.drop_table("credential_revocations")
