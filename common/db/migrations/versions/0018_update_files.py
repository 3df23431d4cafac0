"""update files: the collector update repository in PostgreSQL for hosts that share it

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "update_files",
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("path", name=op.f("pk_update_files")),
    )
    op.create_index(op.f("ix_update_files_revision"), "update_files", ["revision"])
    op.create_table(
        "update_file_chunks",
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["path"],
            ["update_files.path"],
            name=op.f("fk_update_file_chunks_path_update_files"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("path", "n", name=op.f("pk_update_file_chunks")),
    )


def downgrade() -> None:
    op.drop_table("update_file_chunks")
    op.drop_index(op.f("ix_update_files_revision"), table_name="update_files")
    op.drop_table("update_files")
