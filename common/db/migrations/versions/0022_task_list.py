"""task list: indexes for browsing tasks newest first, overall and per site, and for the fleet
overview's outcomes of the last day

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_tasks_created_at_task_id", "tasks", ["created_at", "task_id"])
    op.create_index("ix_tasks_site_id_created_at", "tasks", ["site_id", "created_at"])
    op.create_index("ix_tasks_updated_at", "tasks", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_tasks_updated_at", table_name="tasks")
    op.drop_index("ix_tasks_site_id_created_at", table_name="tasks")
    op.drop_index("ix_tasks_created_at_task_id", table_name="tasks")
