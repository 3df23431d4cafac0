"""API tokens: issue, look up, list and revoke; and the authenticator the gRPC servers use.

A token is ``vsk_`` followed by 256 random bits (URL-safe base64). Only its
SHA-256 is stored; the plaintext is shown once, when it is created. Lookups
are by hash, so a database dump does not hand out working tokens.

The authenticator caches successful lookups for :data:`CACHE_TTL_S` seconds
to keep the database off every RPC's path; revoking a token therefore takes
effect within that time at every replica. Failed lookups are never cached, so
a token works the moment it is created.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, insert, or_, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from common.access.rbac import ALL_TENANTS, Principal, Role
from common.db import audit
from common.db.schema import api_tokens
from common.errors import InvalidArgument, NotFound

TOKEN_PREFIX = "vsk_"  # noqa: S105 - a prefix, not a secret
CACHE_TTL_S = 5.0
CACHE_MAX_ENTRIES = 4096
MAX_TTL_S = 366 * 24 * 3600
MAX_NAME_LENGTH = 100
MAX_TENANTS = 100


def new_plaintext() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(plaintext: str) -> bytes:
    return hashlib.sha256(plaintext.encode()).digest()


@dataclass(frozen=True)
class ApiToken:
    token_id: str
    name: str
    role: Role
    display_prefix: str
    created_by: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    # None: fleet-wide (see common.access.rbac.Principal); ALL_TENANTS inside: every tenant.
    tenants: frozenset[str] | None = None

    @classmethod
    def from_row(cls, row: RowMapping) -> ApiToken:
        tenants = row["tenants"]
        return cls(
            row["token_id"],
            row["name"],
            Role(row["role"]),
            row["display_prefix"],
            row["created_by"],
            row["created_at"],
            row["expires_at"],
            row["revoked_at"],
            frozenset(tenants) if tenants is not None else None,
        )

    def principal(self) -> Principal:
        return Principal(self.token_id, self.name, self.role, self.tenants)


@dataclass(frozen=True)
class Issued:
    token: ApiToken
    plaintext: str

    def __repr__(self) -> str:  # the plaintext must never reach a log line
        return f"Issued(token={self.token!r}, plaintext=<redacted>)"


def tenant_scope(role: Role, tenants: Sequence[str], all_tenants: bool) -> list[str] | None:
    """The stored scope of a new token: platform tokens must name theirs, other roles are fleet-wide."""
    if role != Role.PLATFORM:
        if tenants or all_tenants:
            raise InvalidArgument(
                f"only platform tokens are scoped to tenants; a {role.value} token is fleet-wide",
                code="tenants_not_applicable",
            )
        return None
    if all_tenants:
        if tenants:
            raise InvalidArgument("name tenants or all tenants, not both", code="tenants_invalid")
        return [ALL_TENANTS]
    if not tenants:
        raise InvalidArgument(
            "a platform token needs its tenants (or all tenants, deliberately)", code="tenants_required"
        )
    if len(tenants) > MAX_TENANTS:
        raise InvalidArgument(f"at most {MAX_TENANTS} tenants per token", code="tenants_invalid")
    for t in tenants:
        if not t.strip() or len(t) > MAX_NAME_LENGTH or t == ALL_TENANTS:
            raise InvalidArgument(f"tenant {t!r} is not a tenant id", code="tenants_invalid")
    return sorted(set(tenants))


def _check(name: str, ttl_s: int) -> None:
    if not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(f"name must be 1-{MAX_NAME_LENGTH} characters", code="name_invalid")
    if ttl_s < 0 or ttl_s > MAX_TTL_S:
        raise InvalidArgument(f"ttl must be between 0 (no expiry) and {MAX_TTL_S} s", code="ttl_invalid")


async def create(
    conn: AsyncConnection,
    name: str,
    role: Role,
    created_by: str,
    ttl_s: int = 0,
    service: str = "router",
    tenants: Sequence[str] = (),
    all_tenants: bool = False,
) -> Issued:
    """Insert a new token and its audit row in the caller's transaction.

    Platform tokens need ``tenants`` or ``all_tenants`` (:func:`tenant_scope`).
    """
    _check(name, ttl_s)
    scope = tenant_scope(role, tenants, all_tenants)
    plaintext = new_plaintext()
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ttl_s) if ttl_s else None
    row = (
        (
            await conn.execute(
                insert(api_tokens)
                .values(
                    token_id="tok_" + secrets.token_hex(6),
                    name=name,
                    role=role.value,
                    token_sha256=digest(plaintext),
                    display_prefix=plaintext[: len(TOKEN_PREFIX) + 6],
                    created_by=created_by,
                    expires_at=expires,
                    tenants=scope,
                )
                .returning(*api_tokens.c)
            )
        )
        .mappings()
        .one()
    )
    token = ApiToken.from_row(row)
    await audit.record(
        conn, service=service, actor=created_by, action="api_token.create", subject_type="api_token",
        subject_id=token.token_id,
        details={"after": {"name": name, "role": role.value, "ttl_s": ttl_s, "tenants": scope}},
    )  # fmt: skip
    return Issued(token, plaintext)


async def lookup(conn: AsyncConnection, plaintext: str) -> ApiToken | None:
    """The live (unrevoked, unexpired) token with this plaintext, if any."""
    row = (
        (
            await conn.execute(
                select(*api_tokens.c).where(
                    api_tokens.c.token_sha256 == digest(plaintext),
                    api_tokens.c.revoked_at.is_(None),
                    or_(api_tokens.c.expires_at.is_(None), api_tokens.c.expires_at > func.now()),
                )
            )
        )
        .mappings()
        .first()
    )
    return ApiToken.from_row(row) if row is not None else None


async def list_all(conn: AsyncConnection) -> Sequence[ApiToken]:
    rows = (await conn.execute(select(*api_tokens.c).order_by(api_tokens.c.created_at))).mappings().all()
    return [ApiToken.from_row(r) for r in rows]


async def has_role(conn: AsyncConnection, role: Role) -> bool:
    """Whether any token with ``role`` was ever created (revoked ones count: bootstrap happens once)."""
    found = await conn.execute(select(api_tokens.c.token_id).where(api_tokens.c.role == role.value).limit(1))
    return found.first() is not None


async def revoke(conn: AsyncConnection, token_id: str, actor: str) -> ApiToken:
    row = (
        (
            await conn.execute(
                update(api_tokens)
                .where(api_tokens.c.token_id == token_id)
                .values(revoked_at=func.coalesce(api_tokens.c.revoked_at, func.now()))
                .returning(*api_tokens.c)
            )
        )
        .mappings()
        .first()
    )
    if row is None:
        raise NotFound(f"no API token {token_id!r}", code="api_token_not_found")
    await audit.record(
        conn, service="router", actor=actor, action="api_token.revoke", subject_type="api_token",
        subject_id=token_id, details={"after": {"revoked": True}},
    )  # fmt: skip
    return ApiToken.from_row(row)


class TokenAuthenticator:
    """Resolves presented tokens to principals, with a short positive cache (see module docstring)."""

    def __init__(self, engine: AsyncEngine, ttl_s: float = CACHE_TTL_S):
        self.engine = engine
        self.ttl_s = ttl_s
        self._cache: OrderedDict[bytes, tuple[float, Principal]] = OrderedDict()

    async def authenticate(self, plaintext: str) -> Principal | None:
        if not plaintext.startswith(TOKEN_PREFIX):
            return None
        key = digest(plaintext)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        async with self.engine.connect() as conn:
            token = await lookup(conn, plaintext)
        if token is None:
            self._cache.pop(key, None)
            return None
        principal = token.principal()
        self._cache[key] = (now + self.ttl_s, principal)
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_MAX_ENTRIES:
            self._cache.popitem(last=False)
        return principal
