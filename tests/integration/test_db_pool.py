"""The unpinged pools of the router and the gateway replace connections the server closed."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from common.db.dropped import dropped_by_server
from common.db.engine import create_async
from router.core.sql import sql

APP = "versus-pool-test"


def _terminate(url: str) -> int:
    """End every session of this test's pool from the server side, as a restart does."""
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            (APP,),
        ).fetchone()
    return int(ended[0]) if ended else 0


def _eventually(check: object, what: str) -> None:
    deadline = time.monotonic() + 5
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_an_idle_connection_is_seen_dropped_only_once_its_server_closed_it(database_url: str) -> None:
    with psycopg.connect(database_url, application_name=APP, autocommit=True) as conn:
        assert not dropped_by_server(conn.pgconn)
        # Bytes waiting that are not a close (a notification) leave the connection usable.
        conn.execute("LISTEN pool_test")
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute("NOTIFY pool_test")
        time.sleep(0.2)
        assert not dropped_by_server(conn.pgconn)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert _terminate(database_url) == 1
        _eventually(lambda: dropped_by_server(conn.pgconn), "the server's close was never seen")


async def test_after_the_server_ends_every_pooled_session_no_later_operation_fails(database_url: str) -> None:
    # Before: each dead connection failed the first statement run on it (UNAVAILABLE to a
    # collector's claim) however long after the restart it was next used.
    engine = create_async(database_url, pool_size=5, max_overflow=0, pre_ping=False, application_name=APP)
    try:

        async def hot_path_statement(seconds: float) -> None:
            async with engine.connect() as conn:
                await (await sql(conn)).scalar("SELECT pg_sleep(%(s)s)", {"s": seconds})

        await asyncio.gather(*(hot_path_statement(0.1) for _ in range(5)))  # five pooled connections
        assert engine.pool.checkedin() == 5  # type: ignore[attr-defined]
        assert await asyncio.to_thread(_terminate, database_url) == 5
        await asyncio.sleep(0.2)  # the closes reach this side, as after a restart
        failures = []
        for _ in range(12):
            try:
                await hot_path_statement(0)
            except Exception as exc:  # counted, then shown
                failures.append(repr(exc))
        assert failures == []
    finally:
        await engine.dispose()


@pytest.mark.parametrize("pre_ping", [True, False])
async def test_a_pool_of_live_connections_keeps_them(database_url: str, pre_ping: bool) -> None:
    engine = create_async(database_url, pool_size=2, max_overflow=0, pre_ping=pre_ping, application_name=APP)
    try:
        pids = set()
        for _ in range(6):
            async with engine.connect() as conn:
                pids.add(await (await sql(conn)).scalar("SELECT pg_backend_pid()"))
        assert len(pids) == 1  # reused, not reconnected each time
    finally:
        await engine.dispose()
