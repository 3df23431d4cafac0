"""releases: published collector releases, each collector's upgrade state, and a site's update channel

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        "sites",
        sa.Column("update_channel", sa.Text(), server_default=sa.text("'stable'"), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_sites_update_channel"), "sites", "update_channel IN ('stable', 'beta')"
    )
    op.create_table(
        "releases",
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("os", sa.Text(), nullable=False),
        sa.Column("arch", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("security_fix", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("target_name", sa.Text(), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("notes", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("published_by", sa.Text(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("yanked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("yanked_by", sa.Text(), nullable=True),
        sa.Column("yank_reason", sa.Text(), nullable=True),
        sa.CheckConstraint("channel IN ('stable', 'beta')", name=op.f("ck_releases_channel")),
        sa.UniqueConstraint("target_name", name=op.f("uq_releases_target_name")),
        sa.UniqueConstraint("version", "os", "arch", name=op.f("uq_releases_version_os_arch")),
    )
    op.create_table(
        "collector_updates",
        sa.Column("collector_id", sa.Text(), nullable=False),
        sa.Column("approved_version", sa.Text(), nullable=True),
        sa.Column("approved_by", sa.Text(), nullable=True),
        sa.Column("approved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("target_version", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("state_version", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("state_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('', 'updating', 'updated', 'rolled_back', 'failed')",
            name=op.f("ck_collector_updates_state"),
        ),
        sa.ForeignKeyConstraint(
            ["collector_id"],
            ["collectors.collector_id"],
            name=op.f("fk_collector_updates_collector_id_collectors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("collector_id", name=op.f("pk_collector_updates")),
    )


def downgrade() -> None:
    op.drop_table("collector_updates")
    op.drop_table("releases")
    op.drop_constraint(op.f("ck_sites_update_channel"), "sites", type_="check")
    op.drop_column("sites", "update_channel")
