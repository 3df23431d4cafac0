"""Whether PostgreSQL can take this service's writes right now.

Reachable is not enough for readiness: a server in recovery (a Patroni standby, a primary being
demoted) answers reads but fails every claim, report and lease. During a failover, a multi-host
URL with ``target_session_attrs=read-write`` finds no writable host until the synchronous
standby is promoted. Services report not ready for exactly that window (docs/deployment.md,
"PostgreSQL"), so balancers and orchestrators send work elsewhere, and ready again after
without a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from common.db.engine import CONNECT_TIMEOUT_S, KEEPALIVE_ARGS, first_line
from common.db.urls import libpq_url
from common.telemetry.logs import get_logger

log = get_logger("versus.db.writable")

# How often a service process asks, and how long one answer may take. With Patroni's ttl of 15 s
# the write window is ~15 s (measured, docs/deployment.md); a 2 s period turns readiness within
# two seconds of either edge.
WATCH_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 2.0

READ_ONLY = "read-only: a standby, writes are impossible"


class NotWritable(Exception):
    """The database answered but is a standby (in recovery)."""


async def check_engine(engine: AsyncEngine) -> None:
    """Raise :class:`NotWritable` when ``engine``'s server is in recovery (a pool connection)."""
    async with engine.connect() as conn:
        if (await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar():
            raise NotWritable


async def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a new connection made from ``url`` (as the pools make theirs) lands on a server
    that takes writes; otherwise why not, in one line without secrets.

    A fresh connection each time, not a pool's: what is asked is what the next checkout after a
    failover would get, and a connection to a dead host is never left half-cancelled in a pool.
    """
    try:
        async with asyncio.timeout(timeout_s):
            conninfo = make_conninfo(
                libpq_url(url), connect_timeout=CONNECT_TIMEOUT_S, application_name="versus-readiness",
                **KEEPALIVE_ARGS,
            )  # fmt: skip
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            async with conn:
                cursor = await conn.execute("SELECT pg_is_in_recovery()")
                row = await cursor.fetchone()
    except TimeoutError:
        return f"timed out after {timeout_s:.0f}s"
    except psycopg.Error as exc:
        return f"unreachable: {first_line(exc)}"
    if row is not None and row[0]:
        return READ_ONLY
    return None


@dataclass
class WritableWatch:
    """Probes ``url`` every ``interval_s`` and calls ``changed(reason)`` when the answer changes:
    why writes are impossible, or None when they are possible again. It starts believing the
    database writable (the process checked it at startup)."""

    url: str
    changed: Callable[[str | None], Awaitable[None]]
    interval_s: float = WATCH_INTERVAL_S
    probe: Callable[[str], Awaitable[str | None]] = probe
    reason: str | None = None

    async def step(self) -> None:
        """One probe, and the callback if the answer differs from the last one (an edge is
        logged; a new reason while still not writable only updates what readiness says)."""
        reason = await self.probe(self.url)
        if reason == self.reason:
            return
        edge = (reason is None) != (self.reason is None)
        self.reason = reason
        if edge and reason is None:
            log.info("database_writable_again")
        elif edge:
            log.warning("database_not_writable", reason=reason)
        await self.changed(reason)

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.step()
