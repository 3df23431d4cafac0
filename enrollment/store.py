"""PostgreSQL access for the enrollment service: sites, enrollment tokens, collector identities.

All SQL of the service lives here. The hot path is redemption
(:meth:`EnrollmentStore.redemption`): the token row is locked ``FOR UPDATE``
for the whole enrollment transaction, so concurrent redemptions of one token
serialise and the use counter can never pass ``max_uses``; anything that fails
rolls the transaction back and consumes nothing.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping, and_, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from common.access.rbac import current_actor
from common.db import audit
from common.db.schema import collectors, enrollment_tokens, sites
from common.errors import Conflict, FailedPrecondition, NotFound


@dataclass(frozen=True, slots=True)
class Site:
    site_id: str
    name: str
    tenant_id: str
    update_policy: str
    pinned_version: str | None
    created_at: dt.datetime
    collector_count: int = 0
    update_channel: str = "stable"


@dataclass(frozen=True, slots=True)
class Token:
    token_id: str
    site_id: str
    display_prefix: str
    max_uses: int
    uses: int
    approval_mode: str
    expires_at: dt.datetime
    revoked_at: dt.datetime | None
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Collector:
    collector_id: str
    site_id: str
    tenant_id: str
    status: str
    public_key_der: bytes
    public_key_sha256: bytes
    cert_pem: str
    cert_serial: str
    cert_not_after: dt.datetime
    enrolled_token_id: str | None


def _site(row: RowMapping, count: int = 0) -> Site:
    return Site(
        row["site_id"],
        row["name"],
        row["tenant_id"],
        row["update_policy"],
        row["pinned_version"],
        row["created_at"],
        count,
        row["update_channel"],
    )


def _token(row: RowMapping) -> Token:
    return Token(**{name: row[name] for name in Token.__dataclass_fields__})


def _collector(row: RowMapping) -> Collector:
    return Collector(**{name: row[name] for name in Collector.__dataclass_fields__})


_TOKEN_COLUMNS = [enrollment_tokens.c[name] for name in Token.__dataclass_fields__]
_COLLECTOR_COLUMNS = [collectors.c[name] for name in Collector.__dataclass_fields__]


class Redemption:
    """One enrollment transaction holding the token row lock."""

    def __init__(self, conn: AsyncConnection, token: Token | None):
        self.conn = conn
        self.token = token

    async def collector(self, collector_id: str) -> Collector | None:
        row = (
            (
                await self.conn.execute(
                    select(*_COLLECTOR_COLUMNS).where(collectors.c.collector_id == collector_id)
                )
            )
            .mappings()
            .first()
        )
        return _collector(row) if row else None

    async def create_collector(self, values: dict[str, Any]) -> None:
        assert self.token is not None
        await self.conn.execute(insert(collectors).values(**values, enrolled_token_id=self.token.token_id))
        result = await self.conn.execute(
            update(enrollment_tokens)
            .where(
                and_(
                    enrollment_tokens.c.token_id == self.token.token_id,
                    enrollment_tokens.c.uses < enrollment_tokens.c.max_uses,
                )
            )
            .values(uses=enrollment_tokens.c.uses + 1)
        )
        if result.rowcount != 1:  # cannot happen while the row lock is held; refuse rather than overspend
            raise Conflict("enrollment token has no uses left", code="token_exhausted")

    async def record_dispatch_kids(self, collector_id: str, kids: list[str]) -> None:
        """The dispatch keys the collector is being handed now (a retried enrollment gets today's)."""
        await self.conn.execute(
            update(collectors).where(collectors.c.collector_id == collector_id).values(dispatch_kids=kids)
        )

    async def audit(self, action: str, subject_id: str, details: Mapping[str, Any]) -> None:
        await _audit(self.conn, "collector", action, "collector", subject_id, details)


async def _audit(
    conn: AsyncConnection,
    actor: str,
    action: str,
    subject_type: str,
    subject_id: str,
    details: Mapping[str, Any],
) -> None:
    await audit.record(
        conn, service="enrollment", actor=actor, action=action, subject_type=subject_type,
        subject_id=subject_id, details=details,
    )  # fmt: skip


class EnrollmentStore:
    """The enrollment service's store over one async engine."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def audit_refused_redemption(self, token_id: str, why: str, collector_id: str) -> None:
        """Record that a token that exists was presented and refused (revoked, expired, used up)."""
        async with self.engine.begin() as conn:
            await _audit(conn, "anonymous", "token.redeem_refused", "enrollment_token", token_id,
                         {"reason": why, "requested_collector_id": collector_id})  # fmt: skip

    # --- sites -----------------------------------------------------------------------------------
    async def create_site(
        self,
        name: str,
        tenant_id: str,
        update_policy: str,
        pinned_version: str | None,
        update_channel: str = "stable",
    ) -> Site:
        site_id = f"site-{secrets.token_hex(6)}"
        try:
            async with self.engine.begin() as conn:
                row = (
                    (
                        await conn.execute(
                            insert(sites)
                            .values(
                                site_id=site_id,
                                name=name,
                                tenant_id=tenant_id,
                                update_policy=update_policy,
                                pinned_version=pinned_version,
                                update_channel=update_channel,
                            )
                            .returning(*sites.c)
                        )
                    )
                    .mappings()
                    .one()
                )
                await _audit(
                    conn,
                    current_actor("operator"),
                    "site.create",
                    "site",
                    site_id,
                    {"name": name, "tenant_id": tenant_id},
                )
        except IntegrityError:
            raise Conflict(
                f"tenant {tenant_id!r} already has a site named {name!r}", code="site_name_taken"
            ) from None
        return _site(row)

    async def get_site(self, site_id: str) -> Site:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(*sites.c).where(sites.c.site_id == site_id))).mappings().first()
            if row is None:
                raise NotFound(f"site {site_id!r} does not exist", code="site_not_found")
            count = await self._collector_count(conn, site_id)
        return _site(row, count)

    async def list_sites(self, tenant_id: str, limit: int, after: str) -> list[Site]:
        counts = (
            select(collectors.c.site_id, func.count().label("n")).group_by(collectors.c.site_id).subquery()
        )
        query = (
            select(*sites.c, func.coalesce(counts.c.n, 0).label("collector_count"))
            .outerjoin(counts, counts.c.site_id == sites.c.site_id)
            .where(sites.c.site_id > after)
            .order_by(sites.c.site_id)
            .limit(limit)
        )
        if tenant_id:
            query = query.where(sites.c.tenant_id == tenant_id)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_site(row, row["collector_count"]) for row in rows]

    async def update_site(self, site_id: str, changes: Mapping[str, Any]) -> Site:
        try:
            async with self.engine.begin() as conn:
                row = (
                    (
                        await conn.execute(
                            update(sites)
                            .where(sites.c.site_id == site_id)
                            .values(**changes, updated_at=func.now())
                            .returning(*sites.c)
                        )
                    )
                    .mappings()
                    .first()
                )
                if row is None:
                    raise NotFound(f"site {site_id!r} does not exist", code="site_not_found")
                await _audit(conn, current_actor("operator"), "site.update", "site", site_id, dict(changes))
                count = await self._collector_count(conn, site_id)
        except IntegrityError:
            raise Conflict(
                "another site of this tenant already has that name", code="site_name_taken"
            ) from None
        return _site(row, count)

    async def delete_site(self, site_id: str) -> None:
        async with self.engine.begin() as conn:
            locked = (
                await conn.execute(
                    select(sites.c.site_id).where(sites.c.site_id == site_id).with_for_update()
                )
            ).first()
            if locked is None:
                raise NotFound(f"site {site_id!r} does not exist", code="site_not_found")
            count = await self._collector_count(conn, site_id)
            if count:
                raise FailedPrecondition(
                    f"site {site_id!r} still has {count} enrolled collector(s)", code="site_has_collectors"
                )
            await conn.execute(sites.delete().where(sites.c.site_id == site_id))
            await _audit(conn, current_actor("operator"), "site.delete", "site", site_id, {})

    @staticmethod
    async def _collector_count(conn: AsyncConnection, site_id: str) -> int:
        result = await conn.execute(
            select(func.count()).select_from(collectors).where(collectors.c.site_id == site_id)
        )
        return int(result.scalar_one())

    # --- tokens ----------------------------------------------------------------------------------
    async def insert_token(self, values: dict[str, Any], actor: str) -> Token:
        async with self.engine.begin() as conn:
            exists = (
                await conn.execute(select(sites.c.site_id).where(sites.c.site_id == values["site_id"]))
            ).first()
            if exists is None:
                raise NotFound(f"site {values['site_id']!r} does not exist", code="site_not_found")
            row = (
                (await conn.execute(insert(enrollment_tokens).values(**values).returning(*_TOKEN_COLUMNS)))
                .mappings()
                .one()
            )
            await _audit(
                conn,
                actor,
                "token.issue",
                "enrollment_token",
                values["token_id"],
                {
                    "site_id": values["site_id"],
                    "max_uses": values["max_uses"],
                    "approval_mode": values["approval_mode"],
                },
            )
        return _token(row)

    async def list_tokens(self, site_id: str) -> list[Token]:
        query = select(*_TOKEN_COLUMNS).order_by(enrollment_tokens.c.created_at.desc())
        if site_id:
            query = query.where(enrollment_tokens.c.site_id == site_id)
        async with self.engine.connect() as conn:
            return [_token(row) for row in (await conn.execute(query)).mappings().all()]

    async def revoke_token(
        self, token_id: str, actor: str, *, with_collectors: bool = False
    ) -> tuple[Token, list[str]]:
        """Revoke a token (idempotent); with ``with_collectors`` also every pending or active
        collector it enrolled, in the same transaction, each audited. Returns the token and the
        collectors revoked now."""
        async with self.engine.begin() as conn:
            row = (
                (
                    await conn.execute(
                        update(enrollment_tokens)
                        .where(enrollment_tokens.c.token_id == token_id)
                        .values(revoked_at=func.coalesce(enrollment_tokens.c.revoked_at, func.now()))
                        .returning(*_TOKEN_COLUMNS)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                raise NotFound(f"token {token_id!r} does not exist", code="token_not_found")
            revoked: list[str] = []
            if with_collectors:
                result = await conn.execute(
                    update(collectors)
                    .where(
                        collectors.c.enrolled_token_id == token_id,
                        collectors.c.status.in_(["pending", "active"]),
                    )
                    .values(status="revoked", status_changed_at=func.now())
                    .returning(collectors.c.collector_id, collectors.c.status)
                )
                revoked = sorted(str(r[0]) for r in result)
                for collector_id in revoked:
                    details = {"reason": f"enrollment token {token_id} revoked", "token_id": token_id,
                               "after": {"status": "revoked"}}  # fmt: skip
                    await _audit(conn, actor, "collector.revoked", "collector", collector_id, details)
            await _audit(
                conn, actor, "token.revoke", "enrollment_token", token_id,
                {"with_collectors": with_collectors, "revoked_collectors": revoked},
            )  # fmt: skip
        return _token(row), revoked

    @asynccontextmanager
    async def redemption(self, token_sha256: bytes) -> AsyncIterator[Redemption]:
        """A transaction holding the lock on the token with this hash (``token`` is None if unknown)."""
        async with self.engine.begin() as conn:
            row = (
                (
                    await conn.execute(
                        select(*_TOKEN_COLUMNS)
                        .where(enrollment_tokens.c.token_sha256 == token_sha256)
                        .with_for_update()
                    )
                )
                .mappings()
                .first()
            )
            yield Redemption(conn, _token(row) if row else None)

    async def site_tenant(self, conn: AsyncConnection, site_id: str) -> str:
        return str(
            (await conn.execute(select(sites.c.tenant_id).where(sites.c.site_id == site_id))).scalar_one()
        )

    # --- collectors ------------------------------------------------------------------------------
    async def get_collector(self, collector_id: str) -> Collector:
        async with self.engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(*_COLLECTOR_COLUMNS).where(collectors.c.collector_id == collector_id)
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            raise NotFound(f"collector {collector_id!r} does not exist", code="collector_not_found")
        return _collector(row)

    async def transition(
        self, collector_id: str, allowed_from: set[str], to: str, actor: str, details: dict[str, Any]
    ) -> str:
        """Move a collector from one of ``allowed_from`` to ``to``; returns the new status."""
        async with self.engine.begin() as conn:
            current = (
                await conn.execute(
                    select(collectors.c.status)
                    .where(collectors.c.collector_id == collector_id)
                    .with_for_update()
                )
            ).scalar_one_or_none()
            if current is None:
                raise NotFound(f"collector {collector_id!r} does not exist", code="collector_not_found")
            if current == to:
                return to
            if current not in allowed_from:
                raise FailedPrecondition(
                    f"collector {collector_id!r} is {current}, not {' or '.join(sorted(allowed_from))}",
                    code="collector_wrong_status",
                )
            await conn.execute(
                update(collectors)
                .where(collectors.c.collector_id == collector_id)
                .values(status=to, status_changed_at=func.now())
            )
            details = {**details, "before": {"status": current}, "after": {"status": to}}
            await _audit(conn, actor, f"collector.{to}", "collector", collector_id, details)
        return to

    async def replace_certificate(self, collector_id: str, values: dict[str, Any]) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(collectors).where(collectors.c.collector_id == collector_id).values(**values)
            )
            await _audit(
                conn,
                collector_id,
                "collector.renew",
                "collector",
                collector_id,
                {"cert_serial": values["cert_serial"]},
            )
