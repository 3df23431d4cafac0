"""The time fence between writers of one device, and the clock it relies on (pure code)."""

from __future__ import annotations

import datetime as dt

from common.envelope import fence
from common.envelope.verify import SKEW_ALLOWANCE_S

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def test_fence_covers_the_skew_allowance_and_a_write_in_flight() -> None:
    expires = NOW + dt.timedelta(seconds=90)
    assert fence.fence_after(expires) == expires + dt.timedelta(
        seconds=SKEW_ALLOWANCE_S + fence.WRITE_MARGIN_S
    )
    # The collector's own rule has no allowance: the allowance is the router's.
    assert fence.window_open(expires.timestamp(), int(expires.timestamp()))
    assert not fence.window_open(expires.timestamp() + 0.5, int(expires.timestamp()))


def test_mutation_envelopes_last_the_claim_window_and_the_operation() -> None:
    deadline = NOW + dt.timedelta(hours=1)
    assert fence.mutation_expiry(NOW, deadline, 60, 300) == NOW + dt.timedelta(
        seconds=fence.CLAIM_WINDOW_S + 60
    )
    # Never past the task's deadline, never longer than the general dispatch ttl.
    assert fence.mutation_expiry(NOW, NOW + dt.timedelta(seconds=10), 60, 300) == NOW + dt.timedelta(
        seconds=10
    )
    assert fence.mutation_expiry(NOW, deadline, 3600, 300) == NOW + dt.timedelta(seconds=300)


def test_long_poll_gives_a_precise_offset() -> None:
    # Sent at 100, held 25 s by the server, answered at server time 1125.2, received at 125.4.
    trip = fence.RoundTrip(sent_s=100.0, received_s=125.4, server_s=1125.2, held_s=25.0)
    assert trip.usable()
    assert abs(trip.uncertainty_s - 0.4) < 1e-9
    assert abs(trip.offset_s() - 1000.0) < 0.21  # true offset 1000 within half the uncertainty


def test_an_answer_that_sat_in_a_buffer_is_not_used() -> None:
    # The process was stopped for 20 s after the answer arrived: the round trip shows it.
    trip = fence.RoundTrip(sent_s=100.0, received_s=145.0, server_s=1125.0, held_s=25.0)
    assert not trip.usable()
    # Using it would have moved the clock 20 s back and stretched every window by as much.
    assert trip.offset_s() < 1000 - 9


def test_a_clock_going_backwards_is_not_used() -> None:
    assert not fence.RoundTrip(sent_s=100.0, received_s=99.0, server_s=1000.0, held_s=0.0).usable()
