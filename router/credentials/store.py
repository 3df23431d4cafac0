"""Vault mode B's credential store: write-only values, metadata listings, audited
(router/credentials/vault.py holds the encryption).

A credential is stored per tenant under its reference ``<provider>:<target_ref>`` (the same
names as revocation, router/credentials/revocations.py). The API takes values and never returns them: a
listing shows references, versions, field names and who changed them when. Every write and
every listing is in the audit log; a value is opened only to relay it to a collector for one
dispatch (issue 23, mode B delivery), which is audited too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from common.errors import InvalidArgument, NotFound
from router.core import store
from router.core.sql import Db, sql
from router.credentials.revocations import parse_ref
from router.credentials.vault import MasterKeys, SealedCredential, open_value, rewrap, seal_value

# The largest credential value accepted (a JSON object: a password, a key path, a token...).
MAX_VALUE_BYTES = 16 * 1024

_UPSERT = """
INSERT INTO device_credentials AS c (tenant_id, credential_ref, version, key_id, wrapped_key, nonce,
                                     ciphertext, fields, updated_by)
VALUES (%(tenant)s, %(ref)s, %(version)s, %(kid)s, %(wrapped)s, %(nonce)s, %(ct)s, %(fields)s, %(actor)s)
ON CONFLICT (tenant_id, credential_ref) DO UPDATE
SET version = EXCLUDED.version, key_id = EXCLUDED.key_id, wrapped_key = EXCLUDED.wrapped_key,
    nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext, fields = EXCLUDED.fields,
    updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING tenant_id, credential_ref, version, fields, updated_by, created_at, updated_at"""

_LIST = """
SELECT tenant_id, credential_ref, version, fields, updated_by, created_at, updated_at
FROM device_credentials WHERE tenant_id = ANY(%(tenants)s) OR %(all)s
ORDER BY tenant_id, credential_ref LIMIT %(limit)s"""


def parse_value(raw: bytes) -> dict[str, Any]:
    """A credential value: a non-empty JSON object of at most :data:`MAX_VALUE_BYTES`. Pure."""
    if len(raw) > MAX_VALUE_BYTES:
        raise InvalidArgument(
            f"a credential is at most {MAX_VALUE_BYTES} bytes", code="credential_value_invalid"
        )
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not value:
        raise InvalidArgument("a credential is a non-empty JSON object", code="credential_value_invalid")
    return value


def _sealed(row: Mapping[str, Any]) -> SealedCredential:
    return SealedCredential(
        row["key_id"], bytes(row["wrapped_key"]), bytes(row["nonce"]), bytes(row["ciphertext"])
    )


class CredentialStore:
    """Put, delete, list, open for delivery, and rewrap after a master key rotation."""

    def __init__(self, engine: AsyncEngine, master: MasterKeys):
        self.engine = engine
        self.master = master

    def __repr__(self) -> str:
        return f"CredentialStore({self.master!r})"

    async def put(self, tenant_id: str, ref: str, raw: bytes, actor: str) -> dict[str, Any]:
        parse_ref(ref)
        if not tenant_id:
            raise InvalidArgument("tenant_id is required", code="tenant_id_missing")
        value = parse_value(raw)
        async with self.engine.begin() as conn:
            db = await sql(conn)
            current = await db.scalar(
                "SELECT version FROM device_credentials WHERE tenant_id = %(t)s AND credential_ref = %(r)s "
                "FOR UPDATE",
                {"t": tenant_id, "r": ref},
            )
            version = int(current or 0) + 1
            sealed = seal_value(self.master, tenant_id, ref, version, value)
            row = await db.one(
                _UPSERT,
                {"tenant": tenant_id, "ref": ref, "version": version, "kid": sealed.key_id,
                 "wrapped": sealed.wrapped_key, "nonce": sealed.nonce, "ct": sealed.ciphertext,
                 "fields": sorted(value), "actor": actor},
            )  # fmt: skip
            details = {"tenant_id": tenant_id, "version": version, "fields": sorted(value)}
            await store.audit(conn, actor, "credential.put", ref, details)
        assert row is not None
        return row

    async def delete(self, tenant_id: str, ref: str, actor: str) -> None:
        async with self.engine.begin() as conn:
            gone = await (await sql(conn)).run(
                "DELETE FROM device_credentials WHERE tenant_id = %(t)s AND credential_ref = %(r)s",
                {"t": tenant_id, "r": ref},
            )
            if not gone:
                raise NotFound(f"no credential {ref!r} for tenant {tenant_id!r}", code="credential_not_found")
            await store.audit(conn, actor, "credential.delete", ref, {"tenant_id": tenant_id})

    async def list(self, tenants: Sequence[str] | None, actor: str, limit: int = 500) -> list[dict[str, Any]]:
        """Metadata only (``tenants`` None: every tenant)."""
        async with self.engine.begin() as conn:
            rows = await (await sql(conn)).all(
                _LIST, {"tenants": list(tenants or []), "all": tenants is None, "limit": limit}
            )
            await store.audit(conn, actor, "credential.list", "*", {"tenants": sorted(tenants or ["*"])})
        return rows

    async def open(self, conn: Db, tenant_id: str, ref: str) -> dict[str, Any] | None:
        """The value, for relaying it to one dispatch (the caller audits the delivery)."""
        row = await (await sql(conn)).one(
            "SELECT * FROM device_credentials WHERE tenant_id = %(t)s AND credential_ref = %(r)s",
            {"t": tenant_id, "r": ref},
        )
        if row is None:
            return None
        return open_value(self.master, tenant_id, ref, int(row["version"]), _sealed(row))

    async def rewrap_all(self, actor: str) -> int:
        """Wrap every data key again with the active master key; how many were."""
        done = 0
        async with self.engine.begin() as conn:
            db = await sql(conn)
            rows = await db.all(
                "SELECT * FROM device_credentials WHERE key_id <> %(active)s FOR UPDATE",
                {"active": self.master.active},
            )
            for row in rows:
                again = rewrap(self.master, _sealed(row))
                await db.run(
                    "UPDATE device_credentials SET key_id = %(kid)s, wrapped_key = %(wrapped)s "
                    "WHERE tenant_id = %(t)s AND credential_ref = %(r)s",
                    {"kid": again.key_id, "wrapped": again.wrapped_key, "t": row["tenant_id"],
                     "r": row["credential_ref"]},
                )  # fmt: skip
                done += 1
            await store.audit(
                conn, actor, "credential.rewrap", "*", {"count": done, "active": self.master.active}
            )
        return done
