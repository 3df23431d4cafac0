"""The data tier of deploy/ (PostgreSQL 15 under Patroni, etcd) as the services use it: the schema
migrates through the multi-host URL, a commit acknowledged before the primary dies is on the
promoted standby, the pool writes again without a restart, a planned switchover leaves no call
failing on a connection to the demoted primary, and a standby is not ready."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from common import error_mapping
from common.db import writable
from common.db.engine import create_async
from common.db.migrate import upgrade
from common.db.urls import libpq_url
from gateway.app import GatewayConfig, create_app
from router.core.sql import sql
from tests.support.data_tier import DataTier

pytestmark = pytest.mark.timeout(240)

# What the drill allows a write to wait while a primary is replaced (issue 42; patroni.yml's
# timing gives about 20 s).
WRITE_WINDOW_S = 30.0


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataTier]:
    cluster = DataTier(tmp_path_factory.mktemp("data-tier"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


async def test_an_acknowledged_write_survives_the_primary_and_the_pool_rides_the_failover(
    tier: DataTier, redis_url: str
) -> None:
    upgrade(tier.url)  # the schema is PostgreSQL 15's too, through the multi-host URL
    engine = create_async(tier.url, pool_size=2, max_overflow=0)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE drill (n int PRIMARY KEY, at float8)"))
        acknowledged: list[int] = []
        for n in range(200):
            async with engine.begin() as conn:
                await conn.execute(text("INSERT INTO drill VALUES (:n, :at)"), {"n": n, "at": time.time()})
            acknowledged.append(n)  # the commit returned: the synchronous standby has it
        old = tier.leader()
        standby = tier.sync_standby()
        assert standby is not None and standby != old

        tier.kill_node(old)
        killed = time.monotonic()
        # What the services' readiness watch asks (common/db/writable.py): no writable host now.
        assert await writable.probe(tier.url) is not None
        failures = 0
        while True:  # the same engine, never rebuilt: the pool finds the new primary itself
            try:
                async with engine.begin() as conn:
                    await conn.execute(text("INSERT INTO drill VALUES (-1, 0)"))
                break
            except DBAPIError:
                failures += 1
                assert time.monotonic() - killed < 90, "no writable primary after 90 s"
                await asyncio.sleep(0.1)
        window = time.monotonic() - killed
        assert await writable.probe(tier.url) is None
        print(f"write-unavailability window: {window:.1f} s, {failures} writes refused")  # noqa: T201 - the measure
        assert window <= WRITE_WINDOW_S
        assert tier.leader() == standby  # only the synchronous standby may be promoted
        async with engine.connect() as conn:
            stored = (await conn.execute(text("SELECT n FROM drill WHERE n >= 0 ORDER BY n"))).scalars().all()
        assert list(stored) == acknowledged

        # The old primary comes back as a standby of the new one (pg_rewind), and is not ready.
        tier.start_node(old)
        deadline = time.monotonic() + 90
        while not tier.replicated():
            assert time.monotonic() < deadline, tier.cluster()
            await asyncio.sleep(0.5)
        standby_only = tier.url.replace(
            ",".join(f"{tier.host}:{n.pg_port}" for n in tier.patroni.values()),
            f"{tier.host}:{tier.patroni[old].pg_port}",
        ).replace("target_session_attrs=read-write", "target_session_attrs=any")
        while True:  # "running" in Patroni's view comes before the rejoined node takes connections
            try:
                psycopg.connect(libpq_url(standby_only)).close()
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "the rejoined standby takes no connections"
                await asyncio.sleep(0.5)
        assert await _readiness(standby_only, redis_url) == writable.READ_ONLY
        assert await writable.probe(standby_only) == writable.READ_ONLY
    finally:
        await engine.dispose()


async def _readiness(database_url: str, redis_url: str) -> str:
    app = create_app(GatewayConfig(database_url, redis_url, enrollment_address="127.0.0.1:1"))
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            reply = await client.get("/readyz")
            assert reply.status_code == 503
            return str(reply.json()["checks"]["postgres"])
    finally:
        await lifespan.__aexit__(None, None, None)


async def test_a_switchover_demotes_the_primary_and_no_call_fails_on_its_old_connections(
    tier: DataTier,
) -> None:
    """A planned switchover restarts the old primary as a standby. A pool like the router's hot
    path (not pinged) idle through it still holds connections to the old primary: they are
    dropped at checkout, so once the new primary takes writes each call succeeds on its first
    try, on the new primary. Writes that keep coming meanwhile are refused as retryable
    (``database_unavailable``), never ``internal``."""
    deadline = time.monotonic() + 90
    while not tier.replicated():  # the previous test's node has rejoined as the sync standby
        assert time.monotonic() < deadline, tier.cluster()
        await asyncio.sleep(0.5)
    idle = create_async(tier.url, pool_size=2, max_overflow=0, pre_ping=False)
    busy = create_async(tier.url, pool_size=2, max_overflow=0, pre_ping=False)
    try:
        async with busy.begin() as conn:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS moved (n int PRIMARY KEY)"))

        async def write(engine: AsyncEngine, n: int) -> int:
            async with engine.begin() as conn:
                hot = await sql(conn)
                await hot.run("INSERT INTO moved VALUES (%(n)s)", {"n": n})
                return int(await hot.scalar("SELECT inet_server_port()"))

        ports = await asyncio.gather(write(idle, 1), write(idle, 2))  # both pooled, on the primary
        old, candidate = tier.leader(), tier.sync_standby()
        assert candidate is not None and set(ports) == {tier.patroni[old].pg_port}

        refused: list[str] = []
        began = time.monotonic()
        moved = asyncio.create_task(asyncio.to_thread(tier.switchover, old, candidate))
        n = 2
        while not moved.done():  # writes keep coming while Patroni moves the primary
            n += 1
            try:
                await write(busy, n)
            except Exception as exc:
                refused.append(error_mapping.public_error(exc).code)
                await asyncio.sleep(0.05)
        assert "Successfully switched over" in await moved, await moved
        assert set(refused) <= {"database_unavailable"}, refused
        while await writable.probe(tier.url) is not None:  # the new primary takes writes (host list)
            assert time.monotonic() < deadline + 60, tier.cluster()
            await asyncio.sleep(0.2)
        took = time.monotonic() - began
        for k in range(10):  # no stale connection handed out: each call succeeds on its first try
            assert await write(idle, 10_000 + k) == tier.patroni[candidate].pg_port
        assert tier.leader() == candidate
        print(  # noqa: T201 - the measure
            f"switchover {old} -> {candidate}: writes again after {took:.1f} s, "
            f"{len(refused)} refused, all retryable"
        )
    finally:
        await idle.dispose()
        await busy.dispose()


def test_the_deploy_files_are_what_the_cluster_runs(tier: DataTier) -> None:
    """Nothing in the harness replaces a setting of the shared files: it only adds per-node ones."""
    from tests.support.data_tier import ETCD_ENV, PATRONI_YML, read_env_file

    assert (
        "ETCD_NAME" not in read_env_file(ETCD_ENV) and read_env_file(ETCD_ENV)["ETCD_INITIAL_CLUSTER_TOKEN"]
    )
    assert "synchronous_mode: true" in PATRONI_YML.read_text()
    assert Path("/usr/bin/patroni").exists() and tier.leader()
