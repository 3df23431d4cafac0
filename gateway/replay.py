"""The replay cache: a collector bearer token (``jti``) is accepted once within its lifetime.

Request binding (``common.trust.collector_jwt``) stops a proxy from moving a token to
another request; this stops it from sending the same request again. Each
accepted ``jti`` is written to Redis with ``SET NX`` and an expiry just past the
token's own (its ``exp`` plus the verification leeway), so the cache holds at
most one entry per token still usable and empties itself.

If Redis cannot answer, a request that changes state (every collector call but
the enrollment status read) is refused with 503 ``replay_check_unavailable``:
the collector retries with a fresh token, and nothing is done twice. A read
goes ahead (logged), as a replayed read changes nothing.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import RedisError

from common.errors import Unavailable
from common.redis import revocations
from common.telemetry.logs import get_logger
from common.trust.collector_jwt import LEEWAY_S, BearerClaims, BearerError
from gateway.metrics import REPLAY_CHECKS
from gateway.replay_batch import batcher_for

log = get_logger("versus.gateway.replay")

PREFIX = "versus:jti:"


def key(claims: BearerClaims) -> str:
    return f"{PREFIX}{claims.collector_id}:{claims.token_id}"


async def accept_once(redis: Redis, claims: BearerClaims, now: int, *, changes_state: bool) -> bool:
    """Record ``claims.token_id`` as used; raise ``bearer_replayed`` if it was used before.

    Returns whether the collector's standing changed recently (the revocation flag,
    common/redis/revocations.py), read in the same round trip: the caller then checks the
    collector's record in PostgreSQL again rather than trust a kept one.
    """
    ttl = max(1, claims.expires_at + LEEWAY_S - now + 1)
    try:
        # With the checks of every request that arrived in the same turn of the loop: one round trip.
        fresh, flagged = await batcher_for(redis).check(
            key(claims), ttl, revocations.flag_key(claims.collector_id)
        )
    except (RedisError, OSError, TimeoutError) as exc:
        if changes_state:
            REPLAY_CHECKS.labels("unavailable").inc()
            raise Unavailable(
                "the replay cache cannot be reached; retry with a new token", code="replay_check_unavailable"
            ) from exc
        REPLAY_CHECKS.labels("skipped").inc()
        log.warning("replay cache unavailable; a read goes ahead unchecked", error=type(exc).__name__)
        return True  # nothing known about the collector's standing either: check it
    if not fresh:
        REPLAY_CHECKS.labels("replayed").inc()
        log.warning("a bearer token was presented twice", collector_id=claims.collector_id)
        raise BearerError("this bearer token was already used", code="bearer_replayed")
    REPLAY_CHECKS.labels("accepted").inc()
    return bool(flagged)
