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
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from common.db.metadata import NAMING_CONVENTION, metadata

# Collector releases, upgrades and the deployment's key material are declared beside, on the same
# metadata, and imported from here like every other table.
from common.db.schema_distribution import (
    collector_updates,
    key_material,
    releases,
    update_file_chunks,
    update_files,
)

__all__ = [
    "NAMING_CONVENTION", "collector_updates", "key_material", "metadata", "releases", "update_file_chunks",
    "update_files",
]  # fmt: skip

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
    # The writing transaction's id: the audit export delivers in (xid, id) order, and only rows of
    # transactions older than every one still running, so a late commit is never skipped
    # (router/audit_export/outbox.py).
    Column("xid", BigInteger, nullable=False, server_default=text("(pg_current_xact_id()::text)::bigint")),
    Index(None, "subject_type", "subject_id", "at"),
    Index("ix_audit_events_xid_id", "xid", "id"),
)

# Where each audit export sink has got to in the audit log (router/audit_export/): the last
# delivered row's (xid, id). Owned by the router.
audit_export_cursors = Table(
    "audit_export_cursors",
    metadata,
    Column("sink", Text, primary_key=True),
    Column("xid", BigInteger, nullable=False, server_default=text("0")),
    Column("event_id", BigInteger, nullable=False, server_default=text("0")),
    Column("delivered", BigInteger, nullable=False, server_default=text("0")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# API tokens for gRPC callers (operators, platform modules, internal services). Only the SHA-256 of
# the plaintext is stored. Written by the router's access service and by `versus-cp` bootstrap.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("token_id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("token_sha256", LargeBinary, nullable=False, unique=True),
    Column("display_prefix", Text, nullable=False),
    Column("created_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    # Platform tokens: the tenants they may act for; ["*"] for every tenant. NULL for other roles
    # (fleet-wide) and for platform tokens created before tenant scoping (unscoped, docs/access.md).
    Column("tenants", ARRAY(Text), nullable=True),
    CheckConstraint("role IN ('viewer', 'operator', 'collector-admin', 'platform', 'service')", name="role"),
)

# External secret managers (HashiCorp Vault, AppRole) that collectors in vault mode C use.
# Owned by the router's fleet service.
vault_integrations = Table(
    "vault_integrations",
    metadata,
    Column("integration_id", Text, primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("address", Text, nullable=False),
    Column("role_id", Text, nullable=False),
    Column("kv_mount", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("path_prefix", Text, nullable=False, server_default=text("'versus'")),
    # PEM of the CA behind the Vault's TLS certificate; NULL: the collector host's trust store.
    Column("ca_pem", Text, nullable=True),
    Column("secret_id_delivery", Text, nullable=False, server_default=text("'wrapped'")),
    CheckConstraint("secret_id_delivery IN ('wrapped', 'plain')", name="secret_id_delivery"),
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
    # Release channel the auto policy follows (docs/upgrades.md).
    Column("update_channel", Text, nullable=False, server_default=text("'stable'")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("tenant_id", "name"),
    CheckConstraint("update_policy IN ('manual', 'auto', 'pinned')", name="update_policy"),
    CheckConstraint("update_channel IN ('stable', 'beta')", name="update_channel"),
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

# Collector identities issued by the Collector CA. Owned by the enrollment service, the only
# writer of identity, certificate and status (the router's fleet service asks it over gRPC);
# the router writes only the vault-mode columns. The gateway reads the key and status to
# authenticate bearer tokens.
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
    # Credential vault mode as recorded by a collector-admin; the collector applies it on (re)start.
    Column("vault_mode", Text, nullable=False, server_default=text("'local'")),
    Column("vault_integration_id", Text, ForeignKey("vault_integrations.integration_id"), nullable=True),
    # Vault mode C: the collector's AppRole secret id (or its wrapping token), sealed under the
    # credentials master key (router/credentials/vault.py), and its version (0: none).
    Column("vault_secret", Text, nullable=True),
    Column("vault_secret_version", BigInteger, nullable=False, server_default=text("0")),
    # The dispatch key ids handed to the collector at enrollment: the router signs its envelopes
    # only with one of these (docs/envelope.md, "Rotation today"). NULL: enrolled before 0007.
    Column("dispatch_kids", ARRAY(Text), nullable=True),
    # Version of the collector's signed config (router/trust/collector_docs.py): 0 = the enrollment policy.
    Column("config_version", BigInteger, nullable=False, server_default=text("0")),
    CheckConstraint("status IN ('pending', 'active', 'denied', 'revoked')", name="status"),
    CheckConstraint("vault_mode IN ('local', 'relayed', 'external')", name="vault_mode"),
    CheckConstraint(
        "(vault_mode = 'external') = (vault_integration_id IS NOT NULL)", name="vault_integration"
    ),
    Index(None, "site_id"),
)

# --- task router ----------------------------------------------------------------------------------
# Logical operations submitted by platform modules. Owned by the router.
tasks = Table(
    "tasks",
    metadata,
    Column("task_id", Text, primary_key=True),
    # Idempotency keys are per tenant: one tenant's key can neither find nor block another's task.
    Column("idempotency_key", Text, nullable=False),
    Column("request_sha256", LargeBinary, nullable=False),
    Column("provider", Text, nullable=False),
    Column("operation", Text, nullable=False),
    Column("op_class", Text, nullable=False),
    Column("target_ref", Text, nullable=False),
    Column("site_id", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("params", LargeBinary, nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Column("requires_fips", Boolean, nullable=False),
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("state", Text, nullable=False),
    Column("condition", Text, nullable=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("current_dispatch_id", Text, nullable=True),
    Column("result", LargeBinary, nullable=True),
    Column("error_code", Text, nullable=True),
    Column("evidence", Text, nullable=False, server_default=text("''")),
    Column("resolved_by", Text, nullable=True),
    # An unknown outcome waits here until every envelope of the lost dispatch is past its fence
    # (common/envelope/fence.py); the sweeper climbs the ladder once this time has passed.
    Column("retry_at", DateTime(timezone=True), nullable=True),
    # Collector features the task needs (common/protocol.py FEATURE_FLOORS): placement keeps it
    # from collectors whose protocol version is below any of their floors.
    Column("features", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    # The highest floor among them: a claim settled below it is never handed the task.
    Column("protocol_floor", Integer, nullable=False, server_default=text("1")),
    # A cancel asked for while the task was with a collector (docs/protocol.md, cancel): the
    # collector is told on its next claim; the task ends when it answers.
    Column("cancel_requested_at", DateTime(timezone=True), nullable=True),
    # The submit span's W3C trace context, which every later span of the task continues (placed
    # later, reported, reconciled); NULL while tracing is off (docs/operations.md, "Tracing").
    Column("traceparent", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("op_class IN ('read', 'mutate_reconcilable', 'mutate_terminal')", name="op_class"),
    UniqueConstraint("tenant_id", "idempotency_key"),
    Index(None, "state", "site_id", "created_at"),
    # The task list, newest first (router/dispatch/sql_task_list.py): overall and per site.
    Index("ix_tasks_created_at_task_id", "created_at", "task_id"),
    Index("ix_tasks_site_id_created_at", "site_id", "created_at"),
    # The fleet overview's outcomes of the last day (router/fleet/gauges.py).
    Index("ix_tasks_updated_at", "updated_at"),
)

# One attempt to run a task (or its reconcile-read) on one collector. The dispatch id is the
# envelope's task_id, unique per attempt. Owned by the router.
dispatches = Table(
    "dispatches",
    metadata,
    Column("dispatch_id", Text, primary_key=True),
    Column("task_id", Text, ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("kind", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("collector_id", Text, nullable=False),
    Column("site_id", Text, nullable=False),
    Column("target_ref", Text, nullable=False),
    Column("provider", Text, nullable=False),
    Column("operation", Text, nullable=False),
    Column("op_class", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("lease_epoch", BigInteger, nullable=False, server_default=text("0")),
    Column("envelope", LargeBinary, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("handed_claim_seq", BigInteger, nullable=True),
    Column("handed_at", DateTime(timezone=True), nullable=True),
    # The protocol version settled with the collector on the claim that took it (what it honours).
    Column("handed_protocol", Integer, nullable=True),
    # Streamed output (protocol 4, router/output/streams.py): bytes stored so far (the ack), its SHA-256
    # once the final report verified it, and when retention removed the bytes.
    Column("output_length", BigInteger, nullable=False, server_default=text("0")),
    Column("output_sha256", Text, nullable=True),
    Column("output_purged_at", DateTime(timezone=True), nullable=True),
    # Vault mode B: the device credential relayed with it, encrypted to its collector and signed
    # (common/trust/credential_relay.py); never a value in the clear.
    Column("relayed_credential", Text, nullable=True),
    # The lease span's W3C trace context, which the gateway's hand-out span continues.
    Column("traceparent", Text, nullable=True),
    Column("reported_at", DateTime(timezone=True), nullable=True),
    Column("result", LargeBinary, nullable=True),
    Column("error_code", Text, nullable=True),
    Column("error_message", Text, nullable=True),
    # The collector's signature over its last report (common/trust/report_signature.py): evidence.
    Column("report_signature", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("kind IN ('execute', 'reconcile')", name="kind"),
    Index(None, "collector_id", "state", "created_at"),
    Index(None, "state", "expires_at"),
    Index(None, "task_id"),
)

# The streamed output of dispatches, in chunks at their byte offsets (router/output/streams.py). Owned by
# the router.
output_chunks = Table(
    "output_chunks",
    metadata,
    Column("dispatch_id", Text, ForeignKey("dispatches.dispatch_id", ondelete="CASCADE"), primary_key=True),
    Column("start", BigInteger, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

# Output bytes each tenant holds, bounded by its quota (router/output/streams.py). Owned by the router.
tenant_output = Table(
    "tenant_output",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("bytes", BigInteger, nullable=False),
)

# Device credentials for vault mode B, envelope-encrypted (router/credentials/vault.py): never a
# value or a data key in the clear. Owned by the router.
device_credentials = Table(
    "device_credentials",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("credential_ref", Text, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("key_id", Text, nullable=False),
    Column("wrapped_key", LargeBinary, nullable=False),
    Column("nonce", LargeBinary, nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    # The value's field names (never values), for listings.
    Column("fields", ARRAY(Text), nullable=False),
    Column("updated_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Credentials taken back from running tasks (router/credentials/revocations.py), and each collector's part in
# it. Owned by the router.
credential_revocations = Table(
    "credential_revocations",
    metadata,
    Column("revocation_id", Text, primary_key=True),
    Column("credential_ref", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("reason", Text, nullable=False, server_default=text("''")),
    Column("actor", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("action IN ('scrub', 'kill')", name="action"),
    Index(None, "credential_ref", "created_at"),
)

revocation_targets = Table(
    "revocation_targets",
    metadata,
    Column(
        "revocation_id",
        Text,
        ForeignKey("credential_revocations.revocation_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("collector_id", Text, primary_key=True),
    Column("dispatch_ids", ARRAY(Text), nullable=False),
    Column("state", Text, nullable=False),
    Column("results", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("detail", Text, nullable=False, server_default=text("''")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("state IN ('pending', 'revoked', 'unreachable', 'failed')", name="state"),
    Index(None, "collector_id", "state"),
)

# Every state change of every task, in order. Owned by the router.
task_transitions = Table(
    "task_transitions",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("task_id", Text, ForeignKey("tasks.task_id", ondelete="CASCADE"), nullable=False),
    Column("dispatch_id", Text, nullable=True),
    Column("from_state", Text, nullable=False),
    Column("to_state", Text, nullable=False),
    Column("reason", Text, nullable=False, server_default=text("''")),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index(None, "task_id", "id"),
)

# Single-writer device leases. The row outlives its holder so the epoch only ever grows. Owned by the router.
device_leases = Table(
    "device_leases",
    metadata,
    Column("target_ref", Text, primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("holder_task_id", Text, nullable=True),
    Column("holder_dispatch_id", Text, nullable=True),
    Column("collector_id", Text, nullable=True),
    Column("acquired_at", DateTime(timezone=True), nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    # No new holder before this time: an envelope of an earlier holder might still execute until then.
    Column("fenced_until", DateTime(timezone=True), nullable=True),
)

# What each collector can run and whether it takes new work. Owned by the router.
collector_capabilities = Table(
    "collector_capabilities",
    metadata,
    Column("collector_id", Text, primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("manifest", JSONB, nullable=False),
    Column("fips", Boolean, nullable=False, server_default=text("false")),
    Column("agent_version", Text, nullable=False, server_default=text("''")),
    Column("draining", Boolean, nullable=False, server_default=text("false")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
