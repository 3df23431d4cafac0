"""The revocation broadcast channel: the router announces, every gateway listens (gateway/revocations.py)."""

from __future__ import annotations

from redis.asyncio import Redis

from common.logs import get_logger

CHANNEL = "versus:revoked"

log = get_logger("versus.revocations")


async def announce(redis: Redis, collector_id: str) -> None:
    """Tell every gateway that ``collector_id`` lost its standing (best effort, periodic checks back it)."""
    try:
        await redis.publish(CHANNEL, collector_id)
    except Exception:
        log.warning("revocation broadcast failed; sockets close at their next periodic check", exc_info=True)
