"""The schema's tables for collector releases, their upgrades, the update repository's files and the
deployment's key material (re-exported by common/db/schema.py, on the same metadata)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from common.db.metadata import metadata

# Published collector releases: one row per artifact (version, os, arch), also a target of the TUF
# repository (router/releases/update_repo.py). Yanking keeps the row and removes the target.
# Owned by the router.
releases = Table(
    "releases",
    metadata,
    Column("version", Text, nullable=False),
    Column("os", Text, nullable=False),
    Column("arch", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("security_fix", Boolean, nullable=False, server_default=text("false")),
    # TUF target name, and the artifact's length and SHA-256 as the targets metadata signs them.
    Column("target_name", Text, nullable=False, unique=True),
    Column("length", BigInteger, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("notes", Text, nullable=False, server_default=text("''")),
    Column("published_by", Text, nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("yanked_at", DateTime(timezone=True), nullable=True),
    Column("yanked_by", Text, nullable=True),
    Column("yank_reason", Text, nullable=True),
    # The artifact's SBOM (CycloneDX JSON, router/releases/sbom.py) as published, and what the update
    # repository signs of it (its own TUF target); all null for a release published without one.
    Column("sbom", LargeBinary, nullable=True),
    Column("sbom_target_name", Text, nullable=True),
    Column("sbom_sha256", Text, nullable=True),
    Column("sbom_length", BigInteger, nullable=True),
    Column("sbom_spec_version", Text, nullable=True),
    Column("sbom_components", Integer, nullable=True),
    UniqueConstraint("version", "os", "arch"),
    CheckConstraint("channel IN ('stable', 'beta')", name="channel"),
)

# Each collector's upgrade: the operator's approval (manual policy), the target the policy gives
# (recomputed by router/releases/updates.py and carried in the signed config), and what the collector's
# supervisor last reported. Owned by the router.
collector_updates = Table(
    "collector_updates",
    metadata,
    Column("collector_id", Text, ForeignKey("collectors.collector_id", ondelete="CASCADE"), primary_key=True),
    Column("approved_version", Text, nullable=True),
    Column("approved_by", Text, nullable=True),
    Column("approved_at", DateTime(timezone=True), nullable=True),
    Column("target_version", Text, nullable=True),
    # '' (nothing reported), 'updating', 'updated', 'rolled_back' or 'failed', about state_version.
    Column("state", Text, nullable=False, server_default=text("''")),
    Column("state_version", Text, nullable=True),
    Column("detail", Text, nullable=False, server_default=text("''")),
    Column("state_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("state IN ('', 'updating', 'updated', 'rolled_back', 'failed')", name="state"),
)

# The deployment's key and CA material (common/material/shared.py). One row: which material PostgreSQL
# serves (its id), and in shared mode the material itself, sealed under the operator's material key.
# Every service reads it at start; only `versus-cp material` and the key and CA commands write it.
key_material = Table(
    "key_material",
    metadata,
    Column("name", Text, primary_key=True),
    Column("material_id", Text, nullable=False),
    # 'local': each host keeps its own copy on disk (one host, or copies an operator placed);
    # 'shared': the sealed copy below is the source of truth every replica follows.
    Column("mode", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("sealed_with", Text, nullable=True),
    Column("sealed", LargeBinary, nullable=True),
    # The public files alone (certificates, key set indexes and chains), unsealed: what a gateway
    # needs, so a gateway host never holds the material key nor any private key.
    Column("public", LargeBinary, nullable=True),
    # Public facts (key ids, CA ids) for `versus-cp material status`; never secret.
    Column("summary", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("updated_by", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("mode IN ('local', 'shared')", name="mode"),
    CheckConstraint(
        "mode = 'local' OR (sealed IS NOT NULL AND sealed_with IS NOT NULL AND public IS NOT NULL)",
        name="sealed",
    ),
)

# The collector update repository's files (router/releases/update_repo.py) when several hosts serve it
# (shared key material, docs/deployment.md): each file once, by path, with its SHA-256; its bytes in
# 1 MiB chunks. ``revision`` grows with every write so hosts fetch only what changed. Written by
# routers and the key commands under an advisory lock; read by every router and gateway.
update_files = Table(
    "update_files",
    metadata,
    Column("path", Text, primary_key=True),
    Column("sha256", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("revision", BigInteger, nullable=False, index=True),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

update_file_chunks = Table(
    "update_file_chunks",
    metadata,
    Column("path", Text, ForeignKey("update_files.path", ondelete="CASCADE"), primary_key=True),
    Column("n", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)
