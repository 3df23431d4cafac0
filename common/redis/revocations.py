"""Revocation: the router announces, every gateway listens (gateway/revocations.py) and checks.

Two signals, both best effort (the gateways' periodic checks and the router's own check of
every claim against PostgreSQL back them): a broadcast that closes the collector's open
sockets at once, and a short-lived flag that each gateway reads with the replay check of every
request (gateway/replay.py), so a collector record a gateway keeps for a few seconds
(gateway/store.py) is read again from PostgreSQL on the very next request.
"""

from __future__ import annotations

from redis.asyncio import Redis

from common.telemetry.logs import get_logger

CHANNEL = "versus:revoked"
FLAG_PREFIX = "versus:standing-changed:"
# Longer than any gateway keeps a collector record (gateway/store.py AUTH_CACHE_S), with margin.
FLAG_TTL_S = 300

log = get_logger("versus.revocations")


async def announce(redis: Redis, collector_id: str) -> None:
    """Tell every gateway that ``collector_id`` lost its standing (best effort, periodic checks back it)."""
    try:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(flag_key(collector_id), b"1", ex=FLAG_TTL_S)
            pipe.publish(CHANNEL, collector_id)
            await pipe.execute()
    except Exception:
        log.warning("revocation broadcast failed; sockets close at their next periodic check", exc_info=True)


def flag_key(collector_id: str) -> str:
    """The Redis key that says ``collector_id``'s standing changed in the last :data:`FLAG_TTL_S`."""
    return FLAG_PREFIX + collector_id


async def standing_changed(redis: Redis, collector_id: str) -> None:
    """Set the flag alone (no socket closes): the collector's key or certificate changed, so every
    gateway reads its record from PostgreSQL again on its next request."""
    try:
        await redis.set(flag_key(collector_id), b"1", ex=FLAG_TTL_S)
    except Exception:
        log.warning("standing flag not set; gateways may accept the old key for a few seconds", exc_info=True)
