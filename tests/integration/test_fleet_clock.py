"""The fleet clock against real PostgreSQL: on one machine the offset it measures is tiny."""

from __future__ import annotations

import pytest

from common.db import engine as db_engine
from common.db.fleet_clock import FleetClock

pytestmark = pytest.mark.timeout(30)


async def test_the_offset_from_a_database_on_this_machine_is_near_zero(database_url: str) -> None:
    engine = db_engine.create_async(database_url)
    try:
        clock = FleetClock()
        assert await clock.sync(engine)
        assert clock.measured and abs(clock.offset) < 0.1
    finally:
        await engine.dispose()
