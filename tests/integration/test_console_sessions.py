"""Console sessions in a real Redis: what Redis holds, the idle and absolute timeouts, sign-out,
and cookies that are altered, truncated or from another session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from console import sessions
from console.sessions import SessionStore

pytestmark = pytest.mark.timeout(30)
TOKEN = "vsk_console-test-token-123"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_redis_holds_no_token_and_the_cookie_opens_the_session(redis: Any) -> None:
    store = SessionStore(redis)
    cookie, made = await store.create(TOKEN, "alice", "operator", ("*",))
    assert TOKEN not in cookie and TOKEN not in repr(made)
    for key in await redis.keys(sessions._PREFIX + "*"):
        raw = await redis.get(key)
        assert TOKEN.encode() not in raw and made.csrf.encode() not in raw
        assert 0 < await redis.ttl(key) <= sessions.IDLE_S
    loaded = await store.load(cookie)
    assert loaded is not None and (loaded.token, loaded.name, loaded.role) == (TOKEN, "alice", "operator")
    other = made.csrf[:-1] + ("y" if made.csrf.endswith("x") else "x")  # always another token
    assert loaded.csrf_matches(made.csrf) and not loaded.csrf_matches(other)


async def test_altered_or_foreign_cookies_open_nothing(redis: Any) -> None:
    store = SessionStore(redis)
    cookie, _ = await store.create(TOKEN, "alice", "operator", ())
    other, _ = await store.create(TOKEN, "bob", "viewer", ())
    sid, key = cookie.split(".")
    flipped = key[:-2] + ("A" if key[-2] != "A" else "B") + key[-1]
    for bad in (None, "", "garbage", f"{sid}.{flipped}", f"{sid}.{other.split('.')[1]}", sid, cookie + "."):
        assert await store.load(bad) is None


async def test_idle_and_absolute_timeouts_and_sign_out_end_a_session(redis: Any) -> None:
    clock = Clock()
    store = SessionStore(redis, clock)
    cookie, _ = await store.create(TOKEN, "alice", "operator", ())
    clock.now += sessions.ABSOLUTE_S + 1  # still within Redis's idle TTL, past the absolute limit
    assert await store.load(cookie) is None
    assert await redis.keys(sessions._PREFIX + "*") == []  # and it is gone from Redis

    cookie, _ = await store.create(TOKEN, "alice", "operator", ())
    key = (await redis.keys(sessions._PREFIX + "*"))[0]
    await redis.expire(key, 1)
    assert await store.load(cookie) is not None  # a request refreshes the idle timeout
    assert await redis.ttl(key) > sessions.IDLE_S - 5
    await store.end(cookie)
    assert await store.load(cookie) is None
