"""What the gateway reads from PostgreSQL: collector keys and status, to authenticate bearer tokens.

The collectors table belongs to the enrollment service; the gateway only reads it.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from common.db.schema import collectors

# The periodic standing sweep reads the collectors of open sockets this many at a time.
SWEEP_CHUNK = 1000
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

    async def collector_auth(self, collector_id: str) -> CollectorAuthRecord | None:
        query = select(
            collectors.c.collector_id,
            collectors.c.site_id,
            collectors.c.status,
            collectors.c.public_key_der,
            collectors.c.cert_not_after,
        ).where(collectors.c.collector_id == collector_id)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None:
            return None
        key = _public_key(bytes(row.public_key_der))
        return CollectorAuthRecord(row.collector_id, row.site_id, row.status, key, row.cert_not_after)

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
