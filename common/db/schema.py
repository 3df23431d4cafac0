"""The control plane's PostgreSQL schema, declared in one place.

Every table lives here so Alembic can compare the migrations against one
metadata object. Each service writes only the tables it owns (noted per
table) and reaches the others through its own store module.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Index, MetaData, Table, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB

# Deterministic constraint names keep autogenerate comparisons and
# hand-written migrations in agreement.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# Append-only record of operator and security-relevant actions (resolutions,
# approvals, revocations, token issuance). Written by every service through
# its own store; never updated or deleted by the application.
audit_events = Table(
    "audit_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("service", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("subject_type", Text, nullable=False),
    Column("subject_id", Text, nullable=False),
    Column("request_id", Text, nullable=True),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Index(None, "subject_type", "subject_id", "at"),
)
