"""One clock for what replicas compare: PostgreSQL's.

Liveness lives in Redis as "last heard at" times that one router writes and
another reads (is this collector silent? did its session end?). Two hosts whose
clocks disagree by a few seconds would disagree about who is live at the edge of
the window. Each process therefore measures how far its clock is from
PostgreSQL's (``clock_timestamp()``, halfway through the round trip, as NTP
does) and adds that offset: every replica then reads the same clock without
asking the database each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from common.telemetry.logs import get_logger

log = get_logger("versus.clock")

# How often the offset is measured again (clocks drift slowly; a step shows within this).
SYNC_INTERVAL_S = 60.0
# An offset larger than this is worth an operator's look (NTP keeps hosts within milliseconds).
WARN_OFFSET_S = 1.0
# A round trip slower than this says little about the offset: the measurement is skipped.
MAX_ROUND_TRIP_S = 0.5
_NOW = text("SELECT extract(epoch FROM clock_timestamp())")


class FleetClock:
    """Seconds since the epoch by PostgreSQL's clock (this host's until the first measurement)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.measured = False

    def now(self) -> float:
        return time.time() + self.offset

    def adopt(self, before: float, database: float, after: float) -> bool:
        """Take one measurement: local times around the query and the database's time in between.
        Whether it was precise enough to use."""
        if after - before > MAX_ROUND_TRIP_S:
            return False
        self.offset = database - (before + after) / 2
        if abs(self.offset) > WARN_OFFSET_S and not self.measured:
            log.warning("this host's clock differs from PostgreSQL's", offset_s=round(self.offset, 3))
        self.measured = True
        return True

    async def sync(self, engine: AsyncEngine) -> bool:
        async with engine.connect() as conn:
            before = time.time()
            database = float((await conn.execute(_NOW)).scalar_one())
            after = time.time()
        return self.adopt(before, database, after)

    async def run(self, engine: AsyncEngine, interval_s: float = SYNC_INTERVAL_S) -> None:
        """Until cancelled: measure now and every ``interval_s`` (errors keep the last offset)."""
        while True:
            try:
                await self.sync(engine)
            except Exception:  # PostgreSQL away: the last offset stands
                log.info("clock offset not measured; keeping the last one", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.sleep(interval_s)
