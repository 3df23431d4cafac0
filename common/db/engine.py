"""Engine construction and connectivity checks for PostgreSQL (psycopg 3 under SQLAlchemy 2)."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from common.db.dropped import discard_dropped_at_checkout, discard_not_primary
from common.db.urls import libpq_url, sqlalchemy_url
from common.errors import Unavailable
from common.telemetry.redaction import redact_url

CONNECT_TIMEOUT_S = 5
# A server that vanished without closing its sockets (its host lost power, a partition) is given
# up on within about 10 s of silence, on a connection at rest or with a request unanswered, instead
# of the kernel's two hours or fifteen minutes: the pool then connects to the new primary.
KEEPALIVE_ARGS = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                  "tcp_user_timeout": 10_000}  # fmt: skip


def describe(url: str) -> str:
    """Where a URL points, safe to print: host (or socket dir), port and database."""
    parsed = make_url(sqlalchemy_url(url))
    named = parsed.query.get("host")
    if isinstance(named, tuple) and len(named) > 1:
        return f"{','.join(named)}/{parsed.database or ''}"
    host = parsed.host or (named[0] if isinstance(named, tuple) else named) or "localhost"
    port = parsed.port or parsed.query.get("port") or 5432
    return f"{host}:{port}/{parsed.database or ''}"


def create_async(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 10,
    pre_ping: bool = True,
    application_name: str = "versus-cp",
) -> AsyncEngine:
    """The async engine used by services; ``application_name`` says which one to PostgreSQL
    (``pg_stat_activity``, server logs, ``pg_stat_statements``).

    With ``pre_ping`` every checkout first verifies its connection (one round trip). Without
    it, a checkout only looks at the connection's socket for the close a server that ended the
    session sent (common/db/dropped.py, no round trip), so after a database restart the
    operations in flight at that moment fail and later ones get new connections.
    """
    engine = create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": application_name,
                      **KEEPALIVE_ARGS},
    )  # fmt: skip
    discard_not_primary(engine)
    if not pre_ping:
        discard_dropped_at_checkout(engine)
    return engine


def create_sync(url: str, *, pool_size: int = 5, application_name: str = "versus-cp-admin") -> Engine:
    """A synchronous engine for migrations, admin tasks and the key material's follower."""
    engine = create_engine(
        sqlalchemy_url(url),
        pool_pre_ping=True,
        pool_size=pool_size,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": application_name,
                      **KEEPALIVE_ARGS},
    )  # fmt: skip
    discard_not_primary(engine)
    return engine


def check_reachable(url: str) -> None:
    """Connect once and run ``SELECT 1``; raise :class:`Unavailable` with a one-line reason."""
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise Unavailable(f"cannot connect to PostgreSQL at {describe(url)}: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """The last line of a driver error, without its 'connection failed:' prefix or any URL secret."""
    text = str(exc).strip().splitlines()
    reason = text[-1] if text else type(exc).__name__
    return redact_url(reason.removeprefix("connection failed: ").strip())


def database_name(url: str) -> str:
    return urlsplit(libpq_url(url)).path.lstrip("/") or "postgres"
