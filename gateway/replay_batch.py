"""The replay checks of requests that arrive together, sent to Redis as one pipeline.

Every collector request and control-socket frame costs a replay check (gateway/replay.py): a
``SET NX`` of its token id and a read of the collector's revocation flag. Made one round trip per
request, they cost the gateway a Redis client call each (a quarter of an idle gateway's CPU) and,
when hundreds of frames arrive at once (a reconnect storm, a burst of reports), each holds one of
the process's pooled Redis connections: 300 frames at once kept all 128 busy for seconds and
starved other Redis users. Here the checks asked for in one turn of the event loop leave together
in one pipeline, over one connection, at most :data:`MAX_BATCH` per pipeline; each caller gets its
own two answers, or the pipeline's error. Nothing waits for a batch to fill: a check asked for
alone goes out on the next turn of the loop, as it would have.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from redis.asyncio import Redis

# Checks per pipeline: bounds how long one round trip keeps Redis busy (~1 µs per command).
MAX_BATCH = 500


@dataclass(slots=True)
class _Check:
    key: str
    ttl: int
    flag_key: str
    answer: asyncio.Future[tuple[bool, bool]]


class ReplayBatcher:
    """Coalesces ``SET key NX EX ttl`` + ``EXISTS flag_key`` pairs into pipelines."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._pending: list[_Check] = []
        self._flushing: set[asyncio.Task[None]] = set()
        self.pipelines = 0  # sent so far (tests read it)

    async def check(self, key: str, ttl: int, flag_key: str) -> tuple[bool, bool]:
        """(the key was newly set, the flag exists): both read in the same round trip."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[bool, bool]] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append(_Check(key, ttl, flag_key, answer))
        return await answer

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), MAX_BATCH):
            task = asyncio.get_running_loop().create_task(self._send(pending[start : start + MAX_BATCH]))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _send(self, batch: list[_Check]) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for check in batch:
                    pipe.set(check.key, b"1", nx=True, ex=check.ttl)
                    pipe.exists(check.flag_key)
                replies = await pipe.execute()
        except Exception as exc:  # every caller gets the error
            for check in batch:
                if not check.answer.done():
                    check.answer.set_exception(exc)
            return
        except BaseException:  # cancelled (the process is stopping): so are its callers
            for check in batch:
                check.answer.cancel()
            raise
        self.pipelines += 1
        for i, check in enumerate(batch):
            if not check.answer.done():  # a caller that gave up (cancelled) is skipped
                check.answer.set_result((bool(replies[2 * i]), bool(replies[2 * i + 1])))


_BATCHERS: weakref.WeakKeyDictionary[Redis, ReplayBatcher] = weakref.WeakKeyDictionary()


def batcher_for(redis: Redis) -> ReplayBatcher:
    """The one batcher of a Redis client (each process has one client, bound to its event loop)."""
    found = _BATCHERS.get(redis)
    if found is None:
        found = _BATCHERS[redis] = ReplayBatcher(redis)
    return found
