"""The control plane's PostgreSQL schema, declared in one place.

Every table lives here so Alembic can compare the migrations against one
metadata object. Each service writes only the tables it owns (noted per
table) and reaches the others through its own store module.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
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

# --- enrollment service -------------------------------------------------------------------------
# Sites: reachability domains. Owned by the enrollment service.
sites = Table(
    "sites",
    metadata,
    Column("site_id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("update_policy", Text, nullable=False, server_default=text("'manual'")),
    Column("pinned_version", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("tenant_id", "name"),
    CheckConstraint("update_policy IN ('manual', 'auto', 'pinned')", name="update_policy"),
    CheckConstraint("(update_policy = 'pinned') = (pinned_version IS NOT NULL)", name="pinned_version"),
)

# Enrollment tokens: only the SHA-256 of the plaintext is stored. Owned by the enrollment service.
enrollment_tokens = Table(
    "enrollment_tokens",
    metadata,
    Column("token_id", Text, primary_key=True),
    Column("site_id", Text, ForeignKey("sites.site_id", ondelete="CASCADE"), nullable=False),
    Column("token_sha256", LargeBinary, nullable=False, unique=True),
    Column("display_prefix", Text, nullable=False),
    Column("max_uses", Integer, nullable=False),
    Column("uses", Integer, nullable=False, server_default=text("0")),
    Column("approval_mode", Text, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("uses >= 0 AND uses <= max_uses", name="uses"),
    CheckConstraint("approval_mode IN ('auto', 'manual')", name="approval_mode"),
    Index(None, "site_id"),
)

# Collector identities issued by the Collector CA. Owned by the enrollment service;
# the gateway reads the key and status to authenticate bearer tokens.
collectors = Table(
    "collectors",
    metadata,
    Column("collector_id", Text, primary_key=True),
    Column("site_id", Text, ForeignKey("sites.site_id"), nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("public_key_der", LargeBinary, nullable=False),
    Column("public_key_sha256", LargeBinary, nullable=False),
    Column("cert_pem", Text, nullable=False),
    Column("cert_serial", Text, nullable=False),
    Column("cert_not_after", DateTime(timezone=True), nullable=False),
    Column(
        "enrolled_token_id",
        Text,
        ForeignKey("enrollment_tokens.token_id", ondelete="SET NULL"),
        nullable=True,
    ),
    Column("hostname", Text, nullable=False, server_default=text("''")),
    Column("os", Text, nullable=False, server_default=text("''")),
    Column("arch", Text, nullable=False, server_default=text("''")),
    Column("agent_version", Text, nullable=False, server_default=text("''")),
    Column("fips_requested", Boolean, nullable=False, server_default=text("false")),
    Column("enrolled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("status_changed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("status IN ('pending', 'active', 'denied', 'revoked')", name="status"),
    Index(None, "site_id"),
)
