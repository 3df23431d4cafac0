"""The services' Redis client keeps a bounded pool however many callers are waiting."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.redis import client as redis_client

pytestmark = pytest.mark.timeout(60)


async def test_thousands_of_concurrent_calls_share_a_bounded_pool(redis_url: str) -> None:
    # Unbounded, 10,000 collectors claiming at once opened thousands of connections and hit the
    # server's maxclients; every caller then failed instead of waiting its turn.
    client = redis_client.create_async(redis_url)
    try:
        # BLPOP holds its connection for the whole timeout, so every call needs its own one.
        calls = [
            client.blpop([f"versus:test:empty:{i}"], timeout=0.2)
            for i in range(3 * redis_client.MAX_CONNECTIONS)
        ]
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len(client.connection_pool._in_use_connections))
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*calls)
        watcher.cancel()
        assert results == [None] * len(calls)  # all served, by waiting for a free connection
        assert 0 < peak <= redis_client.MAX_CONNECTIONS
    finally:
        await client.aclose()


async def test_a_subscription_stops_promptly_even_right_after_it_started(redis_url: str) -> None:
    # Seen in a gateway's shutdown right after its start: redis-py swallowed the cancellation that
    # landed while the subscription was connecting, and shutdown waited forever.
    from common.redis.fanout import Fanout, text

    for delay in [0.0, 0.001, 0.005, 0.02, 0.05, 0.1, 0.3] * 2:
        client = redis_client.create_async(redis_url)
        feed = Fanout(client, channel="versus:test", key_of=lambda m: text(m["data"]))
        feed.start()
        await asyncio.sleep(delay)
        started = time.monotonic()
        await asyncio.wait_for(feed.stop(), 10)
        # One swallowed cancellation costs a 0.2 s retry, not the 5 s socket timeout (or forever).
        assert time.monotonic() - started < 1.0, delay
        await client.aclose()
