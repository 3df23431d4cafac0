"""tenant scope: platform API tokens name their tenants; idempotency keys are per tenant

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Existing platform tokens stay unscoped (NULL); docs/access.md says how to replace them.
    op.add_column("api_tokens", sa.Column("tenants", postgresql.ARRAY(sa.Text()), nullable=True))
    op.drop_constraint("uq_tasks_idempotency_key", "tasks", type_="unique")
    op.create_unique_constraint(
        "uq_tasks_tenant_id_idempotency_key", "tasks", ["tenant_id", "idempotency_key"]
    )


def downgrade() -> None:
    op.drop_constraint("uq_tasks_tenant_id_idempotency_key", "tasks", type_="unique")
    op.create_unique_constraint("uq_tasks_idempotency_key", "tasks", ["idempotency_key"])
    op.drop_column("api_tokens", "tenants")
