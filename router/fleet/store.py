"""SQL behind fleet management: the collector list and detail, operator drain, vault settings,
vault integrations (the audit log is router/core/audit.py). Status transitions reuse the
enrollment store's locked transition so approve, deny and revoke follow one rule wherever they
are called from.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import (
    collector_capabilities,
    collector_updates,
    collectors,
    sites,
    vault_integrations,
)
from common.errors import Conflict, NotFound

_COLUMNS = (
    *collectors.c,
    collector_capabilities.c.manifest,
    collector_capabilities.c.draining,
    collector_capabilities.c.fips.label("fips_reported"),
    collector_capabilities.c.agent_version.label("running_version"),
    # The upgrade card (router/releases/updates.py): the site's policy, the approval, target and last report.
    sites.c.update_policy,
    sites.c.update_channel,
    sites.c.pinned_version,
    collector_updates.c.approved_version,
    collector_updates.c.target_version,
    collector_updates.c.state.label("update_state"),
    collector_updates.c.state_version.label("update_state_version"),
    collector_updates.c.detail.label("update_detail"),
    collector_updates.c.state_at.label("update_state_at"),
)


def _joined(*columns: Any) -> Any:
    return (
        select(*(columns or _COLUMNS))
        .join(sites, sites.c.site_id == collectors.c.site_id)
        .outerjoin(collector_capabilities, collector_capabilities.c.collector_id == collectors.c.collector_id)
        .outerjoin(collector_updates, collector_updates.c.collector_id == collectors.c.collector_id)
    )


async def list_collectors(
    conn: AsyncConnection,
    *,
    query: str,
    site_id: str,
    after: str,
    limit: int,
    expiring_within: dt.timedelta | None = None,
    stored_status: Sequence[str] = (),
    driver: str = "",
    among: Sequence[str] | None = None,
    columns: Sequence[Any] = (),
) -> Sequence[RowMapping]:
    """Collectors ordered by id; ``query`` matches id, hostname or site id (case-insensitive substring);
    ``expiring_within`` keeps pending and active collectors whose certificate expires that soon;
    ``stored_status`` keeps those whose stored status is one of these; ``driver`` those whose
    published capabilities list that provider; ``among`` only these collectors; ``columns``
    (default: everything a view shows) and ``limit`` 0 (no limit) serve counting."""
    stmt = _joined(*columns).where(collectors.c.collector_id > after).order_by(collectors.c.collector_id)
    if limit:
        stmt = stmt.limit(limit)
    if stored_status:
        stmt = stmt.where(collectors.c.status.in_(list(stored_status)))
    if driver:
        stmt = stmt.where(collector_capabilities.c.manifest["providers"].has_key(driver))
    if among is not None:
        stmt = stmt.where(collectors.c.collector_id.in_(list(among)))
    if expiring_within is not None:
        stmt = stmt.where(
            collectors.c.status.in_(["pending", "active"]),
            collectors.c.cert_not_after < func.now() + expiring_within,
        )
    if site_id:
        stmt = stmt.where(collectors.c.site_id == site_id)
    if query:
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        stmt = stmt.where(
            or_(
                collectors.c.collector_id.ilike(pattern),
                collectors.c.hostname.ilike(pattern),
                collectors.c.site_id.ilike(pattern),
            )
        )
    return (await conn.execute(stmt)).mappings().all()


async def get_collector(conn: AsyncConnection, collector_id: str, *, lock: bool = False) -> RowMapping:
    stmt = _joined().where(collectors.c.collector_id == collector_id)
    if lock:
        stmt = stmt.with_for_update(of=collectors)
    row = (await conn.execute(stmt)).mappings().first()
    if row is None:
        raise NotFound(f"collector {collector_id!r} does not exist", code="collector_not_found")
    return row


async def set_drained(conn: AsyncConnection, collector_id: str, drained: bool) -> None:
    """Record the operator's drain flag; a collector that never published capabilities gets an empty row."""
    stmt = (
        pg_insert(collector_capabilities)
        .values(collector_id=collector_id, epoch=0, manifest={"providers": {}}, draining=drained)
        .on_conflict_do_update(index_elements=["collector_id"], set_={"draining": drained})
    )
    await conn.execute(stmt)


async def set_vault(
    conn: AsyncConnection, collector_id: str, mode: str, integration_id: str | None, secret: str | None,
    secret_version: int,
) -> None:  # fmt: skip
    await conn.execute(
        update(collectors)
        .where(collectors.c.collector_id == collector_id)
        .values(
            vault_mode=mode,
            vault_integration_id=integration_id,
            vault_secret=secret,
            vault_secret_version=secret_version,
            # A new signed config for the collector (router/trust/collector_docs.py).
            config_version=collectors.c.config_version + 1,
        )
    )


async def get_integration(conn: AsyncConnection, integration_id: str) -> RowMapping:
    row = (
        (
            await conn.execute(
                select(*vault_integrations.c).where(vault_integrations.c.integration_id == integration_id)
            )
        )
        .mappings()
        .first()
    )
    if row is None:
        raise NotFound(
            f"vault integration {integration_id!r} does not exist; create it first",
            code="vault_integration_not_found",
        )
    return row


async def create_integration(conn: AsyncConnection, given: Mapping[str, str]) -> RowMapping:
    integration_id = "vi_" + secrets.token_hex(6)
    values = {**given, "ca_pem": given.get("ca_pem") or None}  # NULL: the collector host's trust store
    try:
        async with conn.begin_nested():
            row = (
                (
                    await conn.execute(
                        insert(vault_integrations)
                        .values(integration_id=integration_id, **values)
                        .returning(*vault_integrations.c)
                    )
                )
                .mappings()
                .one()
            )
    except IntegrityError:
        raise Conflict(
            f"a vault integration named {given['name']!r} exists", code="vault_integration_exists"
        ) from None
    return row


async def list_integrations(conn: AsyncConnection) -> Sequence[RowMapping]:
    stmt = select(*vault_integrations.c).order_by(vault_integrations.c.name)
    return (await conn.execute(stmt)).mappings().all()


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# What deciding "behind the latest release" needs, for counting over the whole fleet.
OUTDATED_COLUMNS = (
    collectors.c.collector_id,
    collectors.c.status,
    collectors.c.os,
    collectors.c.arch,
    sites.c.update_channel,
    func.coalesce(collector_capabilities.c.agent_version, collectors.c.agent_version).label("running"),
)
