"""router: tasks, dispatches, transitions, leases, capabilities

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 10:25:06.787618
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "collector_capabilities",
        sa.Column("collector_id", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("manifest", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("fips", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("agent_version", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("draining", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("collector_id", name=op.f("pk_collector_capabilities")),
    )
    op.create_table(
        "device_leases",
        sa.Column("target_ref", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder_task_id", sa.Text(), nullable=True),
        sa.Column("holder_dispatch_id", sa.Text(), nullable=True),
        sa.Column("collector_id", sa.Text(), nullable=True),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("target_ref", name=op.f("pk_device_leases")),
    )
    op.create_table(
        "tasks",
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("request_sha256", sa.LargeBinary(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("op_class", sa.Text(), nullable=False),
        sa.Column("target_ref", sa.Text(), nullable=False),
        sa.Column("site_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("params", sa.LargeBinary(), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requires_fips", sa.Boolean(), nullable=False),
        sa.Column(
            "labels",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("condition", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("current_dispatch_id", sa.Text(), nullable=True),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("evidence", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "op_class IN ('read', 'mutate_reconcilable', 'mutate_terminal')", name=op.f("ck_tasks_op_class")
        ),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_tasks")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_tasks_idempotency_key")),
    )
    op.create_index(
        op.f("ix_tasks_state_site_id_created_at"), "tasks", ["state", "site_id", "created_at"], unique=False
    )
    op.create_table(
        "dispatches",
        sa.Column("dispatch_id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("collector_id", sa.Text(), nullable=False),
        sa.Column("site_id", sa.Text(), nullable=False),
        sa.Column("target_ref", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("op_class", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("lease_epoch", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("envelope", sa.LargeBinary(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("handed_claim_seq", sa.BigInteger(), nullable=True),
        sa.Column("handed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("error_code", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("kind IN ('execute', 'reconcile')", name=op.f("ck_dispatches_kind")),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.task_id"], name=op.f("fk_dispatches_task_id_tasks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("dispatch_id", name=op.f("pk_dispatches")),
    )
    op.create_index(
        op.f("ix_dispatches_collector_id_state_created_at"),
        "dispatches",
        ["collector_id", "state", "created_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_dispatches_state_expires_at"), "dispatches", ["state", "expires_at"], unique=False
    )
    op.create_index(op.f("ix_dispatches_task_id"), "dispatches", ["task_id"], unique=False)
    op.create_table(
        "task_transitions",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("dispatch_id", sa.Text(), nullable=True),
        sa.Column("from_state", sa.Text(), nullable=False),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.task_id"], name=op.f("fk_task_transitions_task_id_tasks"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_transitions")),
    )
    op.create_index(
        op.f("ix_task_transitions_task_id_id"), "task_transitions", ["task_id", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_task_transitions_task_id_id"), table_name="task_transitions")
    op.drop_table("task_transitions")
    op.drop_index(op.f("ix_dispatches_task_id"), table_name="dispatches")
    op.drop_index(op.f("ix_dispatches_state_expires_at"), table_name="dispatches")
    op.drop_index(op.f("ix_dispatches_collector_id_state_created_at"), table_name="dispatches")
    op.drop_table("dispatches")
    op.drop_index(op.f("ix_tasks_state_site_id_created_at"), table_name="tasks")
    op.drop_table("tasks")
    op.drop_table("device_leases")
    op.drop_table("collector_capabilities")
