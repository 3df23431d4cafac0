"""Redis names the router and the gateway must agree on: liveness, sessions and wake-up channels.

The router records a forwarded claim's heartbeat (router/core/live.py) and the gateway records
the heartbeat of a claim it parks (gateway/parking/beats.py) in the same keys; the router
publishes wake-ups (router/core/wakes.py) on the channels a gateway with parked claims listens
to (gateway/parking/hub.py). Everything else in Redis belongs to one of them alone.
"""

from __future__ import annotations

# Sorted set: collector id -> unix time of its last claim.
LIVE = "versus:live"
# Hash per collector: what its last claim said about its session (session_id, last_claim, ...).
SESSION = "versus:session:"
# Session details outlive the liveness window long enough for operators to see a dead session.
SESSION_TTL_S = 24 * 3600

# One pub/sub channel per wake-up key (a collector id, ``task:<id>``, or a broadcast below).
WAKE = "versus:wake:"
# Payload of a wake-up that only announces work: a woken claim skips its standing re-check.
WORK = b"w"
WORK_TEXT = WORK.decode()
# ... that says a cancel was noted for the collector (router/dispatch/cancels.py).
CANCEL = b"c"
CANCEL_TEXT = CANCEL.decode()
# ... and that a credential revocation was noted for it (router/credentials/revocations.py).
REVOKE = b"r"
REVOKE_TEXT = REVOKE.decode()
# Set for a moment when work is announced for a collector: a claim that starts right after sees
# it in its heartbeat, though the announcement reached no listener of it.
WORK_NOTE = "versus:worknote:"
WORK_NOTE_MS = 2000

# Broadcast wake-up keys (not collector ids: those never contain a colon). Every router listens
# to the first for its whole life; every gateway to the second.
CANDIDATES_CHANGED = "cache:candidates"
# Something every collector's next claim must hear from the router changed: a newer dispatch or
# release key set, or a newer trust bundle (router/trust/fleet_news.py).
FLEET_NEWS = "cache:fleet"
# The versions announced last (JSON), so a router that starts does not announce them again.
FLEET_VERSIONS = "versus:fleet:versions"


def wake_channel(key: str) -> str:
    """The pub/sub channel that wakes waiters on ``key`` (a collector id or a task key)."""
    return WAKE + key


# A tunnel session's record (JSON, common/tunnel/record.py), written by the router that opened it
# and completed by the gateway that holds it; and which gateway holds it (SET NX: exactly one).
TUNNEL = "versus:tunnel:"
TUNNEL_HOLDER = "versus:tunnel-holder:"


def tunnel_wake_key(session_id: str) -> str:
    """The wake-up key on which a gateway tells the router that it holds (or failed) a session."""
    return "tunnel:" + session_id
