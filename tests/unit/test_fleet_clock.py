"""The fleet clock: PostgreSQL's time measured halfway through a round trip; a slow trip is ignored."""

from __future__ import annotations

import time

import pytest

from common.db.fleet_clock import MAX_ROUND_TRIP_S, FleetClock

pytestmark = pytest.mark.timeout(10)


def test_the_offset_is_the_database_time_against_the_midpoint_of_the_round_trip() -> None:
    clock = FleetClock()
    assert clock.adopt(before=1000.0, database=1012.1, after=1000.2)
    assert clock.offset == pytest.approx(12.0)
    assert clock.now() == pytest.approx(time.time() + 12.0, abs=0.05)


def test_a_slow_round_trip_keeps_the_offset_it_had() -> None:
    clock = FleetClock()
    clock.adopt(1000.0, 995.0, 1000.0)
    assert not clock.adopt(1000.0, 2000.0, 1000.0 + MAX_ROUND_TRIP_S + 0.1)
    assert clock.offset == pytest.approx(-5.0)
