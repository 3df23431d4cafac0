"""enrollment: sites, tokens, collectors

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:12:44.455276
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "sites",
        sa.Column("site_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("update_policy", sa.Text(), server_default=sa.text("'manual'"), nullable=False),
        sa.Column("pinned_version", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "(update_policy = 'pinned') = (pinned_version IS NOT NULL)", name=op.f("ck_sites_pinned_version")
        ),
        sa.CheckConstraint(
            "update_policy IN ('manual', 'auto', 'pinned')", name=op.f("ck_sites_update_policy")
        ),
        sa.PrimaryKeyConstraint("site_id", name=op.f("pk_sites")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_sites_tenant_id_name")),
    )
    op.create_table(
        "enrollment_tokens",
        sa.Column("token_id", sa.Text(), nullable=False),
        sa.Column("site_id", sa.Text(), nullable=False),
        sa.Column("token_sha256", sa.LargeBinary(), nullable=False),
        sa.Column("display_prefix", sa.Text(), nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("approval_mode", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "approval_mode IN ('auto', 'manual')", name=op.f("ck_enrollment_tokens_approval_mode")
        ),
        sa.CheckConstraint("uses >= 0 AND uses <= max_uses", name=op.f("ck_enrollment_tokens_uses")),
        sa.ForeignKeyConstraint(
            ["site_id"],
            ["sites.site_id"],
            name=op.f("fk_enrollment_tokens_site_id_sites"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_enrollment_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_enrollment_tokens_token_sha256")),
    )
    op.create_index(op.f("ix_enrollment_tokens_site_id"), "enrollment_tokens", ["site_id"], unique=False)
    op.create_table(
        "collectors",
        sa.Column("collector_id", sa.Text(), nullable=False),
        sa.Column("site_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("public_key_der", sa.LargeBinary(), nullable=False),
        sa.Column("public_key_sha256", sa.LargeBinary(), nullable=False),
        sa.Column("cert_pem", sa.Text(), nullable=False),
        sa.Column("cert_serial", sa.Text(), nullable=False),
        sa.Column("cert_not_after", sa.DateTime(timezone=True), nullable=False),
        sa.Column("enrolled_token_id", sa.Text(), nullable=True),
        sa.Column("hostname", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("os", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("arch", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("agent_version", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("fips_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("enrolled_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column(
            "status_changed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'active', 'denied', 'revoked')", name=op.f("ck_collectors_status")
        ),
        sa.ForeignKeyConstraint(
            ["enrolled_token_id"],
            ["enrollment_tokens.token_id"],
            name=op.f("fk_collectors_enrolled_token_id_enrollment_tokens"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(["site_id"], ["sites.site_id"], name=op.f("fk_collectors_site_id_sites")),
        sa.PrimaryKeyConstraint("collector_id", name=op.f("pk_collectors")),
    )
    op.create_index(op.f("ix_collectors_site_id"), "collectors", ["site_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_collectors_site_id"), table_name="collectors")
    op.drop_table("collectors")
    op.drop_index(op.f("ix_enrollment_tokens_site_id"), table_name="enrollment_tokens")
    op.drop_table("enrollment_tokens")
    op.drop_table("sites")
