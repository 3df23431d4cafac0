"""Replay checks asked for together leave in one pipeline (gateway/replay_batch.py), against a real Redis:
each caller gets its own answers, a token used twice in one batch is still caught, an error reaches
every caller, and a caller that gave up does not disturb the others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from common.embedded.process import free_port
from common.redis.client import create_async
from gateway import replay_batch
from gateway.replay_batch import ReplayBatcher, batcher_for


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = create_async(redis_url)
    yield client
    await client.aclose()


async def test_checks_asked_together_go_in_one_round_trip_with_their_own_answers(redis: Redis) -> None:
    await redis.set("flag:7", b"1")
    batcher = ReplayBatcher(redis)
    answers = await asyncio.gather(
        *(batcher.check(f"jti:{i}", 60, f"flag:{i}") for i in range(300)),
        batcher.check("jti:3", 60, "flag:3"),  # the same token twice in one batch
    )
    assert batcher.pipelines == 1
    assert answers[3] == (True, False) and answers[-1] == (False, False)  # the second use is refused
    assert answers[7] == (True, True)  # this collector's flag is set
    assert all(fresh for fresh, _ in answers[:300])
    assert 0 < await redis.ttl("jti:0") <= 60
    # A later check of a used token is refused too; one asked for alone goes out at once.
    assert await batcher.check("jti:0", 60, "flag:0") == (False, False)
    assert batcher.pipelines == 2


async def test_a_large_burst_is_split_into_bounded_pipelines(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_batch, "MAX_BATCH", 40)
    batcher = ReplayBatcher(redis)
    answers = await asyncio.gather(*(batcher.check(f"big:{i}", 60, "flag:none") for i in range(100)))
    assert batcher.pipelines == 3 and all(a == (True, False) for a in answers)


async def test_an_error_reaches_every_caller_of_the_batch() -> None:
    gone = create_async(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    try:
        batcher = ReplayBatcher(gone)
        results = await asyncio.gather(
            *(batcher.check(f"jti:{i}", 60, "flag") for i in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, RedisConnectionError) for r in results), results
    finally:
        await gone.aclose()


async def test_a_caller_that_gives_up_leaves_the_others_answered(redis: Redis) -> None:
    batcher = ReplayBatcher(redis)
    first = asyncio.ensure_future(batcher.check("gave-up", 60, "flag"))
    second = asyncio.ensure_future(batcher.check("stayed", 60, "flag"))
    await asyncio.sleep(0)  # both queued
    first.cancel()
    assert await second == (True, False)
    assert first.cancelled()


async def test_one_batcher_per_client(redis: Redis) -> None:
    assert batcher_for(redis) is batcher_for(redis)
