"""SQL behind releases and collector upgrades: the ``releases`` and ``collector_updates`` tables
(owned by the router), read together with collectors, their capabilities and sites."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import collector_capabilities, collector_updates, collectors, releases, sites
from common.errors import Conflict, NotFound
from common.protocol import retryable_update_failure

# Every column but the SBOM document itself (up to 1 MiB a row): read only when asked for.
FACTS = tuple(c for c in releases.c if c.name != "sbom")


def _running_counts() -> Any:
    """Active collectors per (running version, os, arch)."""
    return (
        select(
            collector_capabilities.c.agent_version.label("version"),
            collectors.c.os,
            collectors.c.arch,
            func.count().label("n"),
        )
        .join(collectors, collectors.c.collector_id == collector_capabilities.c.collector_id)
        .where(collectors.c.status == "active")
        .group_by(collector_capabilities.c.agent_version, collectors.c.os, collectors.c.arch)
        .subquery()
    )


def _with_counts() -> Any:
    counts = _running_counts()
    return select(*FACTS, func.coalesce(counts.c.n, 0).label("running_count")).outerjoin(
        counts,
        and_(
            counts.c.version == releases.c.version,
            counts.c.os == releases.c.os,
            counts.c.arch == releases.c.arch,
        ),
    )


async def insert_release(conn: AsyncConnection, values: Mapping[str, Any]) -> None:
    try:
        async with conn.begin_nested():
            await conn.execute(insert(releases).values(**values))
    except IntegrityError:
        raise Conflict(
            f"version {values['version']} for {values['os']}/{values['arch']} is already published",
            code="release_exists",
        ) from None


async def list_releases(conn: AsyncConnection, channel: str, include_yanked: bool) -> Sequence[RowMapping]:
    stmt = _with_counts().order_by(releases.c.published_at.desc(), releases.c.target_name)
    if channel:
        stmt = stmt.where(releases.c.channel == channel)
    if not include_yanked:
        stmt = stmt.where(releases.c.yanked_at.is_(None))
    return (await conn.execute(stmt)).mappings().all()


async def get_release(conn: AsyncConnection, version: str) -> Sequence[RowMapping]:
    stmt = _with_counts().where(releases.c.version == version).order_by(releases.c.os, releases.c.arch)
    rows = (await conn.execute(stmt)).mappings().all()
    if not rows:
        raise NotFound(f"no release {version!r}", code="release_not_found")
    return rows


async def yank(conn: AsyncConnection, version: str, actor: str, reason: str) -> Sequence[RowMapping]:
    """Mark every artifact of ``version`` yanked; returns the rows that were not yanked before."""
    stmt = (
        update(releases)
        .where(releases.c.version == version, releases.c.yanked_at.is_(None))
        .values(yanked_at=func.now(), yanked_by=actor, yank_reason=reason)
        .returning(*FACTS)
    )
    return (await conn.execute(stmt)).mappings().all()


async def sboms(conn: AsyncConnection, version: str) -> dict[str, bytes]:
    """The SBOM documents of ``version``'s artifacts, by artifact target name (those that have one)."""
    stmt = select(releases.c.target_name, releases.c.sbom).where(
        releases.c.version == version, releases.c.sbom.is_not(None)
    )
    return {row.target_name: bytes(row.sbom) for row in await conn.execute(stmt)}


async def live_releases(conn: AsyncConnection) -> Sequence[RowMapping]:
    """Every release not yanked (small: one row per version and platform)."""
    stmt = select(*FACTS).where(releases.c.yanked_at.is_(None))
    return (await conn.execute(stmt)).mappings().all()


async def policy_rows(
    conn: AsyncConnection, collector_ids: Sequence[str] | None = None, *, targeted_only: bool = False
) -> Sequence[RowMapping]:
    """What a target is computed from, for every active collector (or those named; or, with
    ``targeted_only``, those that have a target now)."""
    stmt = (
        select(
            collectors.c.collector_id,
            collectors.c.os,
            collectors.c.arch,
            sites.c.update_policy,
            sites.c.update_channel,
            sites.c.pinned_version,
            func.coalesce(collector_capabilities.c.agent_version, collectors.c.agent_version).label(
                "running"
            ),
            collector_updates.c.approved_version,
            collector_updates.c.target_version,
            collector_updates.c.state,
            collector_updates.c.state_version,
            collector_updates.c.detail,
        )
        .join(sites, sites.c.site_id == collectors.c.site_id)
        .outerjoin(collector_capabilities, collector_capabilities.c.collector_id == collectors.c.collector_id)
        .outerjoin(collector_updates, collector_updates.c.collector_id == collectors.c.collector_id)
        .where(collectors.c.status == "active")
    )
    if collector_ids is not None:
        stmt = stmt.where(collectors.c.collector_id.in_(collector_ids))
    if targeted_only:
        stmt = stmt.where(collector_updates.c.target_version.is_not(None))
    return (await conn.execute(stmt)).mappings().all()


async def set_targets(conn: AsyncConnection, targets: Mapping[str, str | None]) -> None:
    """Record each collector's new target and bump its config version (the signed config carries it)."""
    if not targets:
        return
    for collector_id, version in targets.items():
        stmt = pg_insert(collector_updates).values(collector_id=collector_id, target_version=version)
        await conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[collector_updates.c.collector_id], set_={"target_version": version}
            )
        )
    await conn.execute(
        update(collectors)
        .where(collectors.c.collector_id.in_(list(targets)))
        .values(config_version=collectors.c.config_version + 1)
    )


async def get_update(conn: AsyncConnection, collector_id: str, *, lock: bool = False) -> RowMapping | None:
    stmt = select(*collector_updates.c).where(collector_updates.c.collector_id == collector_id)
    if lock:
        stmt = stmt.with_for_update()
    return (await conn.execute(stmt)).mappings().first()


async def upsert_update(conn: AsyncConnection, collector_id: str, values: Mapping[str, Any]) -> None:
    stmt = pg_insert(collector_updates).values(collector_id=collector_id, **values)
    await conn.execute(
        stmt.on_conflict_do_update(index_elements=[collector_updates.c.collector_id], set_=dict(values))
    )


async def record_state(
    conn: AsyncConnection, collector_id: str, state: str, version: str, detail: str, at: dt.datetime
) -> RowMapping | None:
    """Store a supervisor report; returns the row before (None: there was none)."""
    before = await get_update(conn, collector_id, lock=True)
    values: dict[str, Any] = {"state": state, "state_version": version, "detail": detail, "state_at": at}
    # A failed approval is used up: the collector is not sent back to it until approved again. Not
    # when only the download broke: the supervisor tries again with backoff (docs/upgrades.md).
    approved = before is not None and before["approved_version"] == version
    if state in ("rolled_back", "failed") and approved and not retryable_update_failure(detail):
        values.update(approved_version=None, approved_by=None, approved_at=None)
    await upsert_update(conn, collector_id, values)
    return before
