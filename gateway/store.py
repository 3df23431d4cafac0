"""What the gateway reads from PostgreSQL: collector keys and status, to authenticate bearer tokens.

The collectors table belongs to the enrollment service; the gateway only reads it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_public_key
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from common.db.schema import collectors


@dataclass(frozen=True, slots=True)
class CollectorAuthRecord:
    collector_id: str
    site_id: str
    status: str
    public_key: ec.EllipticCurvePublicKey
    cert_not_after: dt.datetime


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
        key = load_der_public_key(row.public_key_der)
        assert isinstance(key, ec.EllipticCurvePublicKey)
        return CollectorAuthRecord(row.collector_id, row.site_id, row.status, key, row.cert_not_after)
