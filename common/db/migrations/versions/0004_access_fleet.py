"""fleet management: API tokens, vault integrations, collector vault mode

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("token_sha256", sa.LargeBinary(), nullable=False),
        sa.Column("display_prefix", sa.Text(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "role IN ('viewer', 'operator', 'collector-admin', 'platform', 'service')",
            name=op.f("ck_api_tokens_role"),
        ),
        sa.PrimaryKeyConstraint("token_id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_api_tokens_token_sha256")),
    )
    op.create_table(
        "vault_integrations",
        sa.Column("integration_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("role_id", sa.Text(), nullable=False),
        sa.Column("kv_mount", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("integration_id", name=op.f("pk_vault_integrations")),
        sa.UniqueConstraint("name", name=op.f("uq_vault_integrations_name")),
    )
    op.add_column(
        "collectors", sa.Column("vault_mode", sa.Text(), server_default=sa.text("'local'"), nullable=False)
    )
    op.add_column("collectors", sa.Column("vault_integration_id", sa.Text(), nullable=True))
    op.create_foreign_key(
        op.f("fk_collectors_vault_integration_id_vault_integrations"),
        "collectors",
        "vault_integrations",
        ["vault_integration_id"],
        ["integration_id"],
    )
    op.create_check_constraint(
        op.f("ck_collectors_vault_mode"), "collectors", "vault_mode IN ('local', 'relayed', 'external')"
    )
    op.create_check_constraint(
        op.f("ck_collectors_vault_integration"),
        "collectors",
        "(vault_mode = 'external') = (vault_integration_id IS NOT NULL)",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_collectors_vault_integration"), "collectors", type_="check")
    op.drop_constraint(op.f("ck_collectors_vault_mode"), "collectors", type_="check")
    op.drop_constraint(
        op.f("fk_collectors_vault_integration_id_vault_integrations"), "collectors", type_="foreignkey"
    )
    op.drop_column("collectors", "vault_integration_id")
    op.drop_column("collectors", "vault_mode")
    op.drop_table("vault_integrations")
    op.drop_table("api_tokens")
