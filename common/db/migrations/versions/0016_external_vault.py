"""external vault: integration path prefix, CA and secret id delivery; each collector's sealed
AppRole secret id

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "vault_integrations",
        sa.Column("path_prefix", sa.Text(), nullable=False, server_default=sa.text("'versus'")),
    )
    op.add_column("vault_integrations", sa.Column("ca_pem", sa.Text(), nullable=True))
    op.add_column(
        "vault_integrations",
        sa.Column("secret_id_delivery", sa.Text(), nullable=False, server_default=sa.text("'wrapped'")),
    )
    op.create_check_constraint(
        op.f("ck_vault_integrations_secret_id_delivery"),
        "vault_integrations",
        "secret_id_delivery IN ('wrapped', 'plain')",
    )
    op.add_column("collectors", sa.Column("vault_secret", sa.Text(), nullable=True))
    op.add_column(
        "collectors",
        sa.Column("vault_secret_version", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("collectors", "vault_secret_version")
    op.drop_column("collectors", "vault_secret")
    op.drop_constraint(op.f("ck_vault_integrations_secret_id_delivery"), "vault_integrations", type_="check")
    op.drop_column("vault_integrations", "secret_id_delivery")
    op.drop_column("vault_integrations", "ca_pem")
    op.drop_column("vault_integrations", "path_prefix")
