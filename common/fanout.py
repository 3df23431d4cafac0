"""One Redis subscription per process, fanned out to local waiters by key.

Used for the router's wake-ups (work routed to a collector, a task changed
state) and the gateway's revocation broadcast. Waiters register *before* they
look at the state they wait on, so a message between the look and the wait is
not lost. Redis is never the source of truth here: if the subscription drops,
waiters fall back to their own timeouts and it is re-established.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from redis.asyncio import Redis

from common.logs import get_logger

log = get_logger("versus.fanout")

# How many times, and how long each, stop() waits for the subscription task to end.
STOP_ATTEMPTS = 10
STOP_ATTEMPT_S = 0.2


class Wake(asyncio.Event):
    """An event that also keeps the payloads of the messages that set it since it was cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: set[str] = set()

    def clear(self) -> None:
        super().clear()
        self.payloads = set()


class Fanout:
    """Subscribe to ``channel`` (or ``pattern``) and set the events registered under ``key_of(message)``."""

    def __init__(
        self,
        redis: Redis,
        *,
        key_of: Callable[[dict[str, Any]], str],
        channel: str | None = None,
        pattern: str | None = None,
    ):
        self.redis = redis
        self._key_of = key_of
        self._channel = channel
        self._pattern = pattern
        self._waiters: dict[str, set[Wake]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        # redis-py can swallow a cancellation that lands while it is inside its own read timeout
        # (seen at shutdown right after start), which left shutdown waiting forever: cancel again
        # until the task ends, and give up with a warning after a bound.
        for _ in range(STOP_ATTEMPTS):
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_ATTEMPT_S)
            if task.done():
                if not task.cancelled() and task.exception() is not None:
                    log.warning("subscription task failed", exc_info=task.exception())
                return
        log.warning("subscription task did not stop", channel=self._channel or self._pattern)

    @contextlib.contextmanager
    def listener(self, key: str) -> Iterator[Wake]:
        """An event set whenever a message for ``key`` arrives while the block runs."""
        event = Wake()
        self._waiters[key].add(event)
        try:
            yield event
        finally:
            self._waiters[key].discard(event)
            if not self._waiters[key]:
                del self._waiters[key]

    def keys(self) -> list[str]:
        """The keys someone in this process is listening for right now."""
        return list(self._waiters)

    def wake(self, key: str, payload: str = "") -> None:
        """Set the events of ``key``'s listeners in this process, as a message for ``key`` would."""
        for event in self._waiters.get(key, ()):
            event.payloads.add(payload)
            event.set()

    async def _listen(self) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    if self._pattern is not None:
                        await pubsub.psubscribe(self._pattern)
                    else:
                        await pubsub.subscribe(self._channel)
                    async for message in pubsub.listen():
                        if message.get("type") not in ("message", "pmessage"):
                            continue
                        self.wake(self._key_of(message), text(message.get("data", b"")))
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis went away: waiters fall back to their timeouts; resubscribe shortly
                log.warning(
                    "subscription lost; retrying", channel=self._channel or self._pattern, exc_info=True
                )
                await asyncio.sleep(1.0)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
