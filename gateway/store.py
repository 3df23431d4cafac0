"""What the gateway reads from PostgreSQL: collector keys and status, to authenticate bearer tokens.

The collectors table belongs to the enrollment service; the gateway only reads it.

An active collector's record is kept for :data:`AUTH_CACHE_S`, so a collector's
requests do not each cost a database read. What could make a kept record wrong
is covered without waiting for it to lapse: a token that does not verify with
the kept key, or a kept certificate that has ended, is checked again against
PostgreSQL (renewal and in-band rotation change both); a revocation is seen on
the very next request, through the flag the router sets in Redis and the replay
check reads in the same round trip (gateway/replay.py); and only active records
are kept, so an approval is seen at once.

Records not kept are read in batches: the reads that are waiting when one query starts all go
into the next (:data:`AUTH_BATCH` ids at most), so a fleet reconnecting to a restarted gateway —
thousands of admissions at once, none of them cached — costs a handful of queries instead of
one each queued on the pool (docs/gateway.md, "Storms").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from common.db.schema import collectors

# The periodic standing sweep reads the collectors of open sockets this many at a time.
SWEEP_CHUNK = 1000
# How long an active collector's auth record is reused (see the module doc), and how many are kept:
# longer than a claim hold, so an idle collector's claims cost no database read.
AUTH_CACHE_S = 120.0
MAX_CACHED_AUTH = 100_000
# Collector records read by one query when many are waiting (a reconnect storm).
AUTH_BATCH = 500
# Parsed public keys kept per process (a P-256 key is a few hundred bytes); more than a gateway's sockets.
KEY_CACHE_SIZE = 32_768


@dataclass(frozen=True, slots=True)
class CollectorAuthRecord:
    collector_id: str
    site_id: str
    status: str
    public_key: ec.EllipticCurvePublicKey
    cert_not_after: dt.datetime


@dataclass(frozen=True, slots=True)
class Standing:
    """What decides whether an authenticated collector may keep using the gateway."""

    status: str
    cert_not_after: dt.datetime


@functools.lru_cache(maxsize=KEY_CACHE_SIZE)
def _public_key(der: bytes) -> ec.EllipticCurvePublicKey:
    # Every request of a collector presents the same key: parse (and validate the point) once.
    key = load_der_public_key(der)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key


class GatewayStore:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self._auth: dict[str, tuple[float, CollectorAuthRecord]] = {}
        # Reads waiting for the next batch, by collector id, and the task that runs the batches.
        self._waiting: dict[str, list[asyncio.Future[CollectorAuthRecord | None]]] = {}
        self._reading: asyncio.Task[None] | None = None

    async def collector_auth(self, collector_id: str, *, fresh: bool = False) -> CollectorAuthRecord | None:
        """The collector's key, site, status and certificate end (kept a few seconds when active,
        unless ``fresh``); None when there is no such collector."""
        if not fresh:
            kept = self._auth.get(collector_id)
            if kept is not None and kept[0] > time.monotonic():
                return kept[1]
        record = await self._read_auth(collector_id)
        if record is not None and record.status == "active":
            if len(self._auth) >= MAX_CACHED_AUTH:
                self._auth.clear()
            self._auth[collector_id] = (time.monotonic() + AUTH_CACHE_S, record)
        else:
            self._auth.pop(collector_id, None)
        return record

    def forget(self, collector_id: str) -> None:
        """Drop the kept record of ``collector_id`` (its standing changed)."""
        self._auth.pop(collector_id, None)

    async def _read_auth(self, collector_id: str) -> CollectorAuthRecord | None:
        """The record of ``collector_id`` from PostgreSQL, read in the next batch."""
        waiter: asyncio.Future[CollectorAuthRecord | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(collector_id, []).append(waiter)
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read_batches())
        return await waiter

    async def _read_batches(self) -> None:
        """Read every waiting record, :data:`AUTH_BATCH` per query, one query at a time."""
        while self._waiting:
            await asyncio.sleep(0)  # reads started in this turn of the loop join the batch
            batch = dict(itertools.islice(self._waiting.items(), AUTH_BATCH))
            for collector_id in batch:
                del self._waiting[collector_id]
            try:
                records = await self._read_many(list(batch))
            except Exception as exc:  # each waiter raises it, mapped as any database error
                for waiters in batch.values():
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(exc)
                continue
            for collector_id, waiters in batch.items():
                for waiter in waiters:
                    if not waiter.done():  # a waiter whose request ended meanwhile is skipped
                        waiter.set_result(records.get(collector_id))

    async def _read_many(self, collector_ids: list[str]) -> dict[str, CollectorAuthRecord]:
        query = select(
            collectors.c.collector_id,
            collectors.c.site_id,
            collectors.c.status,
            collectors.c.public_key_der,
            collectors.c.cert_not_after,
        ).where(collectors.c.collector_id.in_(collector_ids))
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return {
            row.collector_id: CollectorAuthRecord(
                row.collector_id,
                row.site_id,
                row.status,
                _public_key(bytes(row.public_key_der)),
                row.cert_not_after,
            )
            for row in rows
        }

    async def standing(self, collector_id: str) -> Standing | None:
        """The collector's status and certificate expiry, or None when it does not exist."""
        query = select(collectors.c.status, collectors.c.cert_not_after).where(
            collectors.c.collector_id == collector_id
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else Standing(row.status, row.cert_not_after)

    async def lapsed(self, collector_ids: Sequence[str]) -> set[str]:
        """Those of ``collector_ids`` that are no longer active with a valid certificate (or are gone)."""
        active: set[str] = set()
        async with self.engine.connect() as conn:
            for start in range(0, len(collector_ids), SWEEP_CHUNK):
                chunk = collector_ids[start : start + SWEEP_CHUNK]
                query = select(collectors.c.collector_id).where(
                    collectors.c.collector_id.in_(chunk),
                    collectors.c.status == "active",
                    collectors.c.cert_not_after > func.now(),
                )
                active.update((await conn.execute(query)).scalars())
        return set(collector_ids) - active
