"""Fleet news: tell every gateway when all collectors' next claims must reach a router.

A claim the router would answer with nothing waits in the gateway (gateway/parking/), which
hears every wake-up for its collectors. One change concerns every collector at once and has no
wake-up of its own: a newer dispatch or release key set (router/trust/key_chains.py) or trust
bundle (router/trust/delivery.py), which a claim learns of only by asking. Each router checks
the versions every :data:`CHECK_EVERY_S` and, when they differ from the ones last announced (kept
in Redis, so a restarted router does not announce the same versions again), announces them on
the fleet-news channel; every gateway then forwards each collector's next claim.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping

from redis.asyncio import Redis

from common.redis.fanout import text
from common.redis.keys import FLEET_NEWS, FLEET_VERSIONS, WAKE
from common.telemetry.logs import get_logger

log = get_logger("versus.router.trust")

CHECK_EVERY_S = 1.0


async def announce_if_changed(redis: Redis, versions: Mapping[str, int]) -> bool:
    """Announce ``versions`` when they differ from those announced last; whether it announced.

    Nothing to compare (a router without key chains or bundles) announces nothing."""
    if not versions:
        return False
    wanted = json.dumps(dict(sorted(versions.items())), separators=(",", ":"))
    # GETSET: of two routers noticing the same rotation, both may announce; neither misses it.
    previous = await redis.getset(FLEET_VERSIONS, wanted)
    if previous is not None and text(previous) == wanted:
        return False
    await redis.publish(WAKE + FLEET_NEWS, b"k")
    log.info("fleet news announced: collectors' next claims go to a router", versions=wanted)
    return True


async def follow(
    redis: Redis, versions: Callable[[], Mapping[str, int]], every_s: float = CHECK_EVERY_S
) -> None:
    """Until cancelled: announce version changes (a failed check is retried next period)."""
    me = asyncio.current_task()
    # redis-py can swallow a cancellation that lands inside its own read (common/redis/fanout.py
    # says more): the request is still counted, so the loop ends on it rather than spin forever.
    while me is None or not me.cancelling():
        try:
            await announce_if_changed(redis, versions())
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("fleet news check failed; retrying", exc_info=True)
        await asyncio.sleep(every_s)
