"""Wake-ups sharded by interest, against real Redis: a process hears only the keys it listens to, a
listener hears what is published once it is in place, and subscriptions follow the listeners."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from common.embedded.process import free_ports
from common.redis.fanout import UNSUBSCRIBE_EVERY_S, KeyedFanout

pytestmark = pytest.mark.timeout(30)
PREFIX = "versus:test-wake:"


@pytest.fixture
async def hubs(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, KeyedFanout, KeyedFanout]]:
    client = aioredis.Redis.from_url(redis_url)
    a = KeyedFanout(client, prefix=PREFIX, always=("broadcast",))
    b = KeyedFanout(client, prefix=PREFIX, always=("broadcast",))
    a.start()
    b.start()
    try:
        yield client, a, b
    finally:
        await a.stop()
        await b.stop()
        await client.aclose()


async def _subscribers(client: aioredis.Redis, key: str) -> int:
    [(_, count)] = await client.pubsub_numsub(PREFIX + key)
    return int(count)


async def test_each_process_hears_only_the_keys_it_listens_to(
    hubs: tuple[aioredis.Redis, KeyedFanout, KeyedFanout],
) -> None:
    client, a, b = hubs
    async with a.listening("col-1") as woken_a, b.listening("col-2") as woken_b:
        # Published the moment the listener is in place: delivered (the subscription was confirmed).
        await client.publish(PREFIX + "col-1", b"w")
        await asyncio.wait_for(woken_a.wait(), 5)
        assert woken_a.payloads == {"w"}
        await asyncio.sleep(0.2)
        assert not woken_b.is_set() and b.received == 0
        await client.publish(PREFIX + "broadcast", b"1")  # both hear what every replica needs
        for _ in range(100):
            if a.received == 2 and b.received == 1:
                break
            await asyncio.sleep(0.02)
        assert (a.received, b.received) == (2, 1)


async def test_a_channel_nobody_listens_to_is_dropped(
    hubs: tuple[aioredis.Redis, KeyedFanout, KeyedFanout],
) -> None:
    client, a, _ = hubs
    async with a.listening("col-3"):
        assert await _subscribers(client, "col-3") == 1
    for _ in range(int(UNSUBSCRIBE_EVERY_S * 40)):
        if await _subscribers(client, "col-3") == 0:
            break
        await asyncio.sleep(0.05)
    assert await _subscribers(client, "col-3") == 0
    # Listening again subscribes again.
    async with a.listening("col-3") as woken:
        await client.publish(PREFIX + "col-3", b"again")
        await asyncio.wait_for(woken.wait(), 5)


async def test_listeners_are_subscribed_again_after_the_connection_is_cut(
    hubs: tuple[aioredis.Redis, KeyedFanout, KeyedFanout],
) -> None:
    client, a, _ = hubs
    async with a.listening("col-4") as woken:
        await client.client_kill_filter(_type="pubsub")
        for _ in range(200):  # the listen loop reconnects after a second
            if await _subscribers(client, "col-4") == 1:
                break
            await asyncio.sleep(0.05)
        await client.publish(PREFIX + "col-4", b"back")
        await asyncio.wait_for(woken.wait(), 5)


async def test_a_listener_cancelled_as_its_subscription_is_confirmed_ends_cancelled() -> None:
    """A cancel that lands in the same turn of the loop as the subscription's confirmation cancels
    the listener. Python 3.11's ``asyncio.wait_for`` returned the confirmation instead and lost the
    cancel: the router's candidate-change follower then went on listening, and a shutdown waited
    on it forever (a teardown of tests/integration/test_router_pipeline.py under load)."""
    # Redis away (nothing listens on the port): subscriptions wait for confirmations the listen
    # loop would deliver, which this test delivers itself, in the turn it cancels.
    hub = KeyedFanout(aioredis.Redis(port=free_ports(1)[0]), prefix=PREFIX)
    hub.start()
    listened = asyncio.Event()

    async def listen() -> None:
        async with hub.listening("race"):
            listened.set()
            await asyncio.sleep(3600)

    try:
        listener = asyncio.create_task(listen())
        await asyncio.sleep(0.1)  # entered, waiting for the confirmation
        hub._on_reply({"type": "subscribe", "channel": PREFIX + "race"})
        listener.cancel()
        await asyncio.wait({listener}, timeout=2)
        assert listener.cancelled() and not listened.is_set()
    finally:
        await hub.stop()
        await hub.redis.aclose()
