"""The gateway's reads of collector records (gateway/store.py) against real PostgreSQL: concurrent
reads share queries, as a fleet reconnecting to a restarted gateway needs, and a failed query
reaches every read that waited on it."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from sqlalchemy import event, insert
from sqlalchemy.exc import DBAPIError

from common.db import engine as db_engine
from common.db.schema import collectors, sites
from gateway import store as store_module
from gateway.store import GatewayStore
from tests.support.pki import p256

pytestmark = pytest.mark.timeout(60)


async def _fleet(database_url: str, count: int) -> list[str]:
    engine = db_engine.create_async(database_url, pool_size=1)
    ids = [f"col-store-{i:04d}" for i in range(count)]
    async with engine.begin() as conn:
        await conn.execute(insert(sites).values(site_id="site-store", name="site-store", tenant_id="t"))
        rows = []
        for cid in ids:
            der = (
                p256()
                .public_key()
                .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            )
            rows.append({
                "collector_id": cid, "site_id": "site-store", "tenant_id": "t", "status": "active",
                "public_key_der": der, "public_key_sha256": hashlib.sha256(der).digest(), "cert_pem": "",
                "cert_serial": "0", "cert_not_after": dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
            })  # fmt: skip
        await conn.execute(insert(collectors), rows)
    await engine.dispose()
    return ids


def _count_statements(engine: Any) -> list[str]:
    seen: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: seen.append(str(a[2])))
    return seen


async def test_concurrent_reads_share_queries_and_each_gets_its_own_record(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "AUTH_BATCH", 100)
    ids = await _fleet(database_url, 250)
    engine = db_engine.create_async(database_url, pool_size=5)
    statements = _count_statements(engine)
    store = GatewayStore(engine)
    try:
        wanted = [*ids, "col-store-missing", ids[0]]  # one unknown, one asked twice
        records = await asyncio.gather(*(store.collector_auth(cid) for cid in wanted))
    finally:
        await engine.dispose()
    assert [r.collector_id if r else None for r in records] == [*ids, None, ids[0]]
    # 251 distinct ids, 100 per query: 3 queries, not 252.
    assert len([s for s in statements if "FROM collectors" in s]) == 3


async def test_a_failed_query_fails_every_read_waiting_on_it(database_url: str) -> None:
    ids = await _fleet(database_url, 5)
    # A database that does not exist: the connection itself fails.
    engine = db_engine.create_async(database_url.rsplit("/", 1)[0] + "/no_such_database", pool_size=1)
    store = GatewayStore(engine)
    try:
        outcomes = await asyncio.gather(*(store.collector_auth(cid) for cid in ids), return_exceptions=True)
    finally:
        await engine.dispose()
    assert all(isinstance(o, DBAPIError) for o in outcomes), outcomes
    assert not store._waiting  # nothing left behind for a later batch
