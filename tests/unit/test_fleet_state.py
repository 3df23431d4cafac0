"""The collector-status and session-state machines, fed values (no I/O)."""

from __future__ import annotations

import datetime as dt

import pytest

from router.core.fleet_state import (
    DEAD_AFTER_S,
    REACHABLE_S,
    STALE_AFTER_S,
    CollectorStatus,
    SessionState,
    collector_status,
    probe,
    routable,
    session_state,
)

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(days=30)
EARLIER = NOW - dt.timedelta(seconds=1)


@pytest.mark.parametrize(
    ("stored", "not_after", "expected"),
    [
        ("pending", LATER, CollectorStatus.PENDING),
        ("active", LATER, CollectorStatus.ACTIVE),
        ("active", EARLIER, CollectorStatus.EXPIRED),
        ("active", NOW, CollectorStatus.EXPIRED),  # not_after is the first instant it is invalid
        ("pending", EARLIER, CollectorStatus.EXPIRED),
        ("revoked", EARLIER, CollectorStatus.REVOKED),  # final states keep their reason
        ("denied", EARLIER, CollectorStatus.DENIED),
    ],
)
def test_status_expires_on_its_own_but_final_states_stay(
    stored: str, not_after: dt.datetime, expected: CollectorStatus
) -> None:
    assert collector_status(stored, not_after, NOW) is expected


def test_unknown_stored_status_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="'retired'"):
        collector_status("retired", LATER, NOW)


@pytest.mark.parametrize(
    ("age", "drained", "expected"),
    [
        (None, False, SessionState.DEAD),
        (0.0, False, SessionState.ACTIVE),
        (STALE_AFTER_S, False, SessionState.ACTIVE),
        (STALE_AFTER_S + 0.1, False, SessionState.STALE),
        (DEAD_AFTER_S, False, SessionState.STALE),
        (DEAD_AFTER_S + 0.1, False, SessionState.DEAD),
        (1.0, True, SessionState.DRAINING),
        (STALE_AFTER_S + 1, True, SessionState.DRAINING),
        (DEAD_AFTER_S + 1, True, SessionState.DEAD),  # a dead session is dead, drained or not
        (-5.0, False, SessionState.ACTIVE),  # a heartbeat "from the future" (clock step) is fresh
    ],
)
def test_session_state_follows_the_heartbeat_age(
    age: float | None, drained: bool, expected: SessionState
) -> None:
    now = 10_000.0
    last = None if age is None else now - age
    assert session_state(last, drained, now) is expected


def test_probe_threshold_is_ninety_seconds() -> None:
    now = 10_000.0
    assert probe(now - (REACHABLE_S - 0.001), False, now).reachable
    just_over = probe(now - REACHABLE_S, False, now)
    assert not just_over.reachable
    assert just_over.heartbeat_age_s == REACHABLE_S
    assert just_over.session is SessionState.STALE
    never = probe(None, False, now)
    assert (never.reachable, never.heartbeat_age_s, never.session) == (False, None, SessionState.DEAD)


def test_only_active_collectors_with_a_live_undrained_session_are_routable() -> None:
    assert routable(CollectorStatus.ACTIVE, SessionState.ACTIVE)
    assert routable(CollectorStatus.ACTIVE, SessionState.STALE)
    assert not routable(CollectorStatus.ACTIVE, SessionState.DRAINING)
    assert not routable(CollectorStatus.ACTIVE, SessionState.DEAD)
    for status in (CollectorStatus.PENDING, CollectorStatus.REVOKED, CollectorStatus.EXPIRED):
        assert not routable(status, SessionState.ACTIVE)


def test_a_collector_that_said_goodbye_is_offline_not_lost() -> None:
    now = 10_000.0
    for age in (1.0, STALE_AFTER_S + 1, DEAD_AFTER_S + 1):
        assert session_state(now - age, False, now, said_goodbye=True) is SessionState.OFFLINE
    fresh = probe(now - 1.0, False, now, said_goodbye=True)
    assert (fresh.reachable, fresh.session) == (False, SessionState.OFFLINE)
    assert not routable(CollectorStatus.ACTIVE, SessionState.OFFLINE)
