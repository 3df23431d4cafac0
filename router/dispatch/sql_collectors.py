"""The SQL placement and hand-out read about collectors: candidates, capacity, standing, keys.

* **capacity** - the collector's capabilities row is locked ``FOR UPDATE``
  while its in-flight work is counted and a dispatch added."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    RowMapping,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import (
    collector_capabilities,
    collectors,
    sites,
)
from router.core.sql import Db, sql
from router.dispatch.sql_dispatches import HANDED_OUT

_CANDIDATES = """
SELECT c.collector_id, c.site_id, c.tenant_id, c.status, cc.epoch, cc.updated_at, cc.fips, cc.draining,
       c.dispatch_kids, c.vault_mode
FROM collectors c JOIN collector_capabilities cc ON cc.collector_id = c.collector_id
WHERE c.site_id = %(site)s AND c.tenant_id = %(tenant)s AND c.status = 'active'
  AND c.cert_not_after > now()"""


async def candidates(conn: Db, site_id: str, tenant_id: str) -> list[dict[str, Any]]:
    """Active, unexpired collectors of the site and tenant that published a manifest (its version only)."""
    return await (await sql(conn)).all(_CANDIDATES, {"site": site_id, "tenant": tenant_id})


async def manifests(conn: Db, collector_ids: Sequence[str]) -> list[dict[str, Any]]:
    """collector_id, manifest, epoch and updated_at of these collectors."""
    return await (await sql(conn)).all(
        "SELECT collector_id, manifest, epoch, updated_at FROM collector_capabilities"
        " WHERE collector_id = ANY(%(ids)s)",
        {"ids": list(collector_ids)},
    )


_LOCK_COLLECTOR = """
SELECT cc.collector_id
FROM collector_capabilities cc JOIN collectors c ON c.collector_id = cc.collector_id
WHERE cc.collector_id = %(id)s AND c.status = 'active' AND c.cert_not_after > now() AND NOT cc.draining
FOR UPDATE OF cc"""


async def lock_collector(conn: Db, collector_id: str, *, skip_locked: bool) -> bool:
    """Lock one collector's capabilities row (its capacity) if it may take work now.

    False when the collector is no longer active, its certificate ended, an operator drains
    it, or (with ``skip_locked``) another placement holds the lock. This is the authoritative
    check: the candidate list placement starts from may be up to a second old.

    A placement waits only for the first collector it tries and skips locked ones after that,
    so two placements never wait on each other while holding a collector lock: no deadlock.
    """
    query = _LOCK_COLLECTOR + (" SKIP LOCKED" if skip_locked else "")
    return await (await sql(conn)).one(query, {"id": collector_id}) is not None


_IN_FLIGHT_COUNT = """
SELECT count(*) FROM dispatches
WHERE collector_id = %(id)s AND provider = %(provider)s AND state IN ('leased', 'dispatched', 'running')"""


async def in_flight(conn: Db, collector_id: str, provider: str) -> int:
    """The collector's dispatches of ``provider`` in flight.

    A statement of its own, after :func:`lock_collector`: a statement's snapshot is taken when it
    starts, so a count in the locking statement would miss work committed by the placement it
    waited for (tests/integration/test_router_concurrency.py).
    """
    return int(await (await sql(conn)).scalar(_IN_FLIGHT_COUNT, {"id": collector_id, "provider": provider}))


async def set_dispatch_kids(conn: AsyncConnection, collector_id: str, kids: Sequence[str]) -> bool:
    """Record the dispatch kids a collector holds; True when that changed anything."""
    result = await conn.execute(
        update(collectors)
        .where(collectors.c.collector_id == collector_id)
        .where(collectors.c.dispatch_kids.is_distinct_from(list(kids)))
        .values(dispatch_kids=list(kids))
    )
    return bool(result.rowcount)


async def collector_public_key(conn: Db, collector_id: str) -> bytes | None:
    """The DER public key on record for ``collector_id`` (it verifies the collector's reports)."""
    found = await (await sql(conn)).scalar(
        "SELECT public_key_der FROM collectors WHERE collector_id = %(id)s", {"id": collector_id}
    )
    return None if found is None else bytes(found)


async def upsert_capabilities(
    conn: AsyncConnection,
    collector_id: str,
    epoch: int,
    manifest: Mapping[str, Any],
    fips: bool,
    version: str,
) -> int:
    """Store the manifest unless a newer epoch is already recorded; returns the recorded epoch."""
    values = {"epoch": epoch, "manifest": dict(manifest), "fips": fips, "agent_version": version}
    stmt = (
        pg_insert(collector_capabilities)
        .values(collector_id=collector_id, **values)
        .on_conflict_do_update(
            index_elements=["collector_id"],
            set_={**values, "updated_at": func.now()},
            where=collector_capabilities.c.epoch <= epoch,
        )
        .returning(collector_capabilities.c.epoch)
    )  # fmt: skip
    stored = (await conn.execute(stmt)).scalar_one_or_none()
    if stored is not None:
        return int(stored)
    current = await conn.execute(
        select(collector_capabilities.c.epoch).where(collector_capabilities.c.collector_id == collector_id)
    )
    return int(current.scalar_one())


_STANDING = f"""
SELECT c.status, c.cert_not_after, c.config_version, c.dispatch_kids, c.vault_mode, c.vault_integration_id,
       c.vault_secret, c.vault_secret_version,
       v.address, v.role_id, v.kv_mount, v.path_prefix, v.ca_pem, v.secret_id_delivery,
       r.version AS target_version, r.target_name, r.sha256 AS target_sha256, r.length AS target_length,
       (%(before)s > 0 AND EXISTS (SELECT 1 FROM dispatches d WHERE {HANDED_OUT})) AS handed_out
FROM collectors c
LEFT JOIN vault_integrations v ON v.integration_id = c.vault_integration_id
LEFT JOIN collector_updates u ON u.collector_id = c.collector_id
LEFT JOIN releases r
    ON r.version = u.target_version AND r.os = c.os AND r.arch = c.arch AND r.yanked_at IS NULL
WHERE c.collector_id = %(collector)s"""


async def collector_standing(conn: Db, collector_id: str, before_claim_seq: int = 0) -> dict[str, Any] | None:
    """Status, certificate end, config version, dispatch kids and recorded vault settings of one
    collector (checked on every claim), and ``handed_out``: whether a dispatch handed out in a claim
    before ``before_claim_seq`` is still unreported (an unlocked read: almost always false; when true
    the claim looks closer with :func:`handed_out`). The upgrade target the signed config names
    comes with it (router/releases/updates.py)."""
    return await (await sql(conn)).one(_STANDING, {"collector": collector_id, "before": before_claim_seq})


async def collector_home(conn: AsyncConnection, collector_id: str) -> RowMapping | None:
    """Site and tenant of one collector (None: no such collector)."""
    query = select(collectors.c.site_id, collectors.c.tenant_id).where(
        collectors.c.collector_id == collector_id
    )
    return (await conn.execute(query)).mappings().first()


async def site_tenant(conn: AsyncConnection, site_id: str) -> str | None:
    """The tenant a site belongs to (None: no such site)."""
    return (
        await conn.execute(select(sites.c.tenant_id).where(sites.c.site_id == site_id))
    ).scalar_one_or_none()


async def collector_site(conn: AsyncConnection, collector_id: str) -> str | None:
    result = await conn.execute(select(collectors.c.site_id).where(collectors.c.collector_id == collector_id))
    return result.scalar_one_or_none()


async def soonest_cert_expiry(conn: AsyncConnection) -> dt.datetime | None:
    """The earliest certificate expiry among active collectors."""
    result = await conn.execute(
        select(func.min(collectors.c.cert_not_after)).where(collectors.c.status == "active")
    )
    value: dt.datetime | None = result.scalar_one()
    return value
