"""Claims parked in the gateway (gateway/parking/): an idle collector's repeated claims cost the router
nothing, and everything the router announces still reaches the collector at once.

Real gateway, router, PostgreSQL and Redis on real sockets (tests/integration/test_gateway_collector.py
``running_stack``); the router's claim entry point is counted to see which claims reached it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common.redis.keys import LIVE, SESSION
from router.trust import fleet_news
from tests.integration.test_gateway_collector import Collector, Stack, running_stack

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

# Short holds keep the tests quick; at or above the shortest hold that parks (PARK_MIN_HOLD_S).
HOLD = 1.5


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        yield running


class Counted:
    """Counts the claims that reached the router."""

    def __init__(self, stack: Stack):
        self.calls = 0
        original = stack.router.claim_with_offers

        async def counted(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            return await original(*args, **kw)

        stack.router.claim_with_offers = counted  # type: ignore[method-assign]


def _body(c: Collector, **extra: Any) -> dict[str, Any]:
    return {"wait_s": HOLD, "session_id": f"s-{c.collector_id}", "capacity": {"stub": 4}, **extra}


async def _idle(stack: Stack, name: str) -> tuple[Collector, Counted]:
    """A live collector whose last claim the router answered with nothing, nothing announced since
    (its first session: nothing to supersede, so no wake-up)."""
    c = await stack.enroll(name)
    assert (await stack.publish(c)).status_code == 200
    counted = Counted(stack)
    for seq in (1, 2):
        assert (await stack.post("/claim", _body(c, claim_seq=seq), c)).status_code == 204
    assert counted.calls == 1
    counted.calls = 0
    return c, counted


async def test_an_idle_collectors_repeated_claims_never_reach_the_router(stack: Stack) -> None:
    c, counted = await _idle(stack, "col-idle")
    before = await stack.redis.zscore(LIVE, c.collector_id)
    for seq in (3, 4, 5):
        started = time.monotonic()
        reply = await stack.post("/claim", _body(c, claim_seq=seq), c)
        assert reply.status_code == 204
        assert time.monotonic() - started >= HOLD - 0.1  # held the whole hold, here
        assert int(reply.headers["X-Versus-Held-Ms"]) >= (HOLD - 0.1) * 1000
    assert counted.calls == 0
    # Its heartbeat still reaches Redis (batched, within a second): placement and the sweeper see it live.
    for _ in range(300):
        seen = await stack.redis.zscore(LIVE, c.collector_id)
        if seen is not None and before is not None and seen > before + HOLD:
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the parked claims' heartbeat was not recorded")
    assert await stack.redis.hget(SESSION + c.collector_id, "claim_seq") == b"5"


async def test_work_routed_to_a_parked_claims_collector_reaches_it_at_once(stack: Stack) -> None:
    c, counted = await _idle(stack, "col-work")
    waiting = asyncio.create_task(stack.post("/claim", _body(c, claim_seq=4, wait_s=20), c))
    await _parked(stack, 1)
    submitted_at = time.monotonic()
    await stack.submit("t-parked")
    reply = await waiting
    assert reply.status_code == 200, reply.text
    assert time.monotonic() - submitted_at < 5.0  # woken, not at the end of its 20 s hold
    assert counted.calls == 1


async def test_work_routed_between_claims_is_taken_by_the_next_one(stack: Stack) -> None:
    c, counted = await _idle(stack, "col-between")
    await stack.submit("t-between")  # no claim in flight: the gateway's watch hears the wake-up
    await asyncio.sleep(0.2)
    reply = await stack.post("/claim", _body(c, claim_seq=4), c)
    assert reply.status_code == 200, reply.text
    assert counted.calls == 1


async def test_a_claim_that_says_something_new_goes_to_the_router(stack: Stack) -> None:
    c, counted = await _idle(stack, "col-news")
    assert (await stack.post("/claim", _body(c, claim_seq=4, draining=True), c)).status_code == 204
    assert counted.calls == 1
    assert await stack.redis.hget(SESSION + c.collector_id, "draining") == b"1"


async def test_fleet_news_sends_every_watched_collectors_next_claim_to_the_router(stack: Stack) -> None:
    c, counted = await _idle(stack, "col-fleet")
    # What a router announces when it finds a newer key set or trust bundle.
    assert await fleet_news.announce_if_changed(stack.redis, {"dispatch": 99})
    assert not await fleet_news.announce_if_changed(stack.redis, {"dispatch": 99})  # said once
    await asyncio.sleep(0.2)
    assert (await stack.post("/claim", _body(c, claim_seq=4), c)).status_code == 204
    assert counted.calls == 1


async def test_a_parked_claim_of_a_revoked_collector_is_refused_at_once(stack: Stack) -> None:
    c, _ = await _idle(stack, "col-revoked")
    waiting = asyncio.create_task(stack.post("/claim", _body(c, claim_seq=4, wait_s=20), c))
    await _parked(stack, 1)
    started = time.monotonic()
    await stack.service.revoke(c.collector_id, "operator:test", "test")
    await stack.router.collector_removed(c.collector_id)
    reply = await waiting
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"]["code"] == "collector_revoked"
    assert time.monotonic() - started < 5.0


async def test_after_redis_lost_its_data_the_next_claim_is_recorded_by_the_router(stack: Stack) -> None:
    c, counted = await _idle(stack, "col-flush")
    await stack.redis.flushall()
    # The parked heartbeat is refused (no session to refresh): the claim is sent on to the router.
    reply = await stack.post("/claim", _body(c, claim_seq=4, wait_s=20), c)
    assert reply.status_code == 204
    assert counted.calls == 1
    session = await stack.redis.hgetall(SESSION + c.collector_id)
    assert session[b"session_id"] == f"s-{c.collector_id}".encode()


async def test_a_lost_subscription_sends_parked_claims_to_the_router(stack: Stack) -> None:
    c, counted = await _idle(stack, "col-cut")
    waiting = asyncio.create_task(stack.post("/claim", _body(c, claim_seq=4, wait_s=20), c))
    await _parked(stack, 1)
    await stack.redis.client_kill_filter(_type="pubsub")  # every subscription, the gateway's too
    # Wake-ups sent while it reconnects would be lost: the parked claim goes to the router, which
    # holds it (and hears its own wake-ups) for the rest of its hold.
    for _ in range(500):
        if counted.calls == 1:
            break
        await asyncio.sleep(0.01)
    assert counted.calls == 1
    await stack.submit("t-cut")
    reply = await waiting
    assert reply.status_code == 200, reply.text


async def _parked(stack: Stack, count: int) -> None:
    """Until ``count`` claims wait in the gateway."""
    parking = stack.app.state.parking
    for _ in range(500):
        if sum(len(waiters) for waiters in parking._waiters.values()) >= count:
            return
        await asyncio.sleep(0.01)
    pytest.fail("no claim parked")


async def test_a_newer_session_ends_a_parked_claim_of_the_one_it_replaced(stack: Stack) -> None:
    c, _ = await _idle(stack, "col-restart")
    old = asyncio.create_task(stack.post("/claim", _body(c, claim_seq=4, wait_s=20), c))
    await _parked(stack, 1)
    started = time.monotonic()
    # The collector restarted (a new process, a new session) and claims through another connection.
    new = await stack.post("/claim", _body(c, claim_seq=1, session_id="s-new", resume=True), c)
    assert new.status_code == 204
    # A newer claim of the collector ends the older one still parked here at once (collectors claim
    # one at a time), and the old process's next claim, naming its replaced session, is refused.
    assert (await old).status_code == 204
    assert time.monotonic() - started < 5.0
    refused = await stack.post("/claim", _body(c, claim_seq=5), c)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "session_superseded"
