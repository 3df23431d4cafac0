"""The backup archive's format: what it holds and how a restore proves it whole. Pure code.

A backup is one tar file (mode 0600) with exactly these members::

    manifest.json     what the rest is: format, when, schema revision, server and tool versions,
                      the key material's id/version/mode, and each other member's SHA-256 and size
    database.dump     pg_dump's custom format of the whole database (consistent snapshot)
    material.sealed   local mode only: this host's key and CA material (common/material/bundle.py)
                      sealed under the operator's material key, as the shared row is

Nothing in it is a plaintext secret: the database holds key material only sealed (shared mode),
collectors' credentials only as hashes, and the local material is sealed here. The material key
that opens either is never written into a backup; the operator keeps it apart
(docs/deployment.md, "Backup and restore").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from common.errors import FailedPrecondition, InvalidArgument

FORMAT = "versus-backup/1"
MANIFEST = "manifest.json"
DATABASE = "database.dump"
MATERIAL = "material.sealed"
MEMBERS = (MANIFEST, DATABASE, MATERIAL)
# The sealed local material is bound to this name and the material's version (common/material/bundle.py).
SEAL_NAME = "backup"
# A manifest is a few hundred bytes; anything this large is not one.
MANIFEST_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    created_at: str
    schema_revision: str
    server_major: int
    dump_tool_major: int
    material_mode: str
    material_id: str
    material_version: int
    sealed_with: str | None
    members: dict[str, Member] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "created_at": self.created_at,
            "schema_revision": self.schema_revision,
            "server_major": self.server_major,
            "dump_tool_major": self.dump_tool_major,
            "material": {
                "mode": self.material_mode,
                "material_id": self.material_id,
                "version": self.material_version,
                "sealed_with": self.sealed_with,
            },
            "members": {m.name: {"sha256": m.sha256, "size": m.size} for m in self.members.values()},
        }
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def corrupt(reason: str) -> InvalidArgument:
    return InvalidArgument(f"not a usable backup: {reason}", code="backup_corrupt")


def parse_manifest(raw: bytes) -> Manifest:
    """The manifest of an archive; ``backup_corrupt`` for anything this version cannot trust."""
    if len(raw) > MANIFEST_LIMIT:
        raise corrupt("the manifest is too large")
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise corrupt(f"format {doc.get('format')!r}, this version reads {FORMAT!r}")
        material = doc["material"]
        members = {
            str(name): Member(str(name), str(entry["sha256"]), int(entry["size"]))
            for name, entry in doc["members"].items()
        }
        manifest = Manifest(
            created_at=str(doc["created_at"]),
            schema_revision=str(doc["schema_revision"]),
            server_major=int(doc["server_major"]),
            dump_tool_major=int(doc["dump_tool_major"]),
            material_mode=str(material["mode"]),
            material_id=str(material["material_id"]),
            material_version=int(material["version"]),
            sealed_with=None if material.get("sealed_with") is None else str(material["sealed_with"]),
            members=members,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise corrupt(f"the manifest is malformed ({type(exc).__name__})") from None
    unknown = set(members) - set(MEMBERS) or ({MANIFEST} & set(members))
    if unknown:
        raise corrupt(f"unexpected members {sorted(unknown)}")
    needed = {DATABASE} | ({MATERIAL} if manifest.material_mode == "local" else set())
    if needed - set(members):
        raise corrupt(f"members missing from the manifest: {sorted(needed - set(members))}")
    return manifest


class Digest:
    """SHA-256 and size of a member as it streams through."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self.size += len(chunk)

    def member(self, name: str) -> Member:
        return Member(name, self._hash.hexdigest(), self.size)


def check_member(expected: Member, seen: Member) -> None:
    """``backup_corrupt`` unless a member's bytes are the ones the manifest names."""
    if (expected.sha256, expected.size) != (seen.sha256, seen.size):
        raise corrupt(f"{expected.name} does not match its checksum (damaged or altered)")


def check_restorable(manifest: Manifest, target_major: int) -> None:
    """A dump restores onto a server of its own major version or newer, never older: an older
    server may not know what the newer one wrote."""
    if target_major < manifest.server_major:
        raise FailedPrecondition(
            f"the backup is of PostgreSQL {manifest.server_major}; the target server is "
            f"{target_major}: restore onto {manifest.server_major} or newer",
            code="restore_server_too_old",
        )
