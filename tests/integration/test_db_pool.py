"""The unpinged pools of the router and the gateway replace connections the server closed, and every
pool replaces a connection whose server stopped taking writes."""

from __future__ import annotations

import asyncio
import time

import grpc
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from common import error_mapping
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


async def _backend(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        pid = await (await sql(conn)).scalar("SELECT pg_backend_pid()")
        await conn.commit()
    return int(pid)


@pytest.mark.parametrize("path", ["driver", "sqlalchemy"])
async def test_a_connection_whose_server_stopped_taking_writes_is_replaced(
    database_url: str, path: str
) -> None:
    # A fenced primary (default_transaction_read_only turned on and reloaded) keeps its sessions
    # but refuses their writes with 25006; libpq's read-write check only runs at connect. Set here
    # on the pooled session itself, so that only this test's connection sees it.
    engine = create_async(database_url, pool_size=1, max_overflow=0, pre_ping=path == "sqlalchemy",
                          application_name=APP)  # fmt: skip
    try:
        fenced = await _backend(engine)
        async with engine.connect() as conn:
            await conn.execute(text("SET SESSION default_transaction_read_only = on"))
            await conn.commit()

        async def write() -> None:
            async with engine.begin() as conn:
                if path == "driver":
                    await (await sql(conn)).run("CREATE TEMP TABLE pool_test_write (a int)")
                else:
                    await conn.execute(text("CREATE TEMP TABLE pool_test_write (a int)"))

        with pytest.raises(Exception) as refused:  # noqa: PT011 - the type depends on the path
            await write()
        public = error_mapping.public_error(refused.value)
        assert (public.code, error_mapping.status_for(refused.value).grpc_code) == (
            "database_unavailable", grpc.StatusCode.UNAVAILABLE,
        )  # fmt: skip
        # The next checkout is a new session, which takes writes at once.
        assert await _backend(engine) != fenced
        async with engine.begin() as conn:
            assert await (await sql(conn)).run("CREATE TEMP TABLE pool_test_write (a int)") == -1
    finally:
        await engine.dispose()
