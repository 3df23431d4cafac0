"""Revocation broadcast: open sockets of a revoked collector close at once, on every gateway.

The router publishes the collector id on one Redis channel when an operator
revokes it; each gateway process listens and wakes the standing check of that
collector's open control and tunnel sockets, which then re-read the status
from PostgreSQL (the source of truth) and close with 4401. A slow periodic
check (``revocation_check_s``, 60 s by default) remains as the safety net for
a lost message or a certificate that simply expires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterator

from redis.asyncio import Redis

from common.logs import get_logger
from common.revocations import CHANNEL

log = get_logger("versus.gateway.revocations")


class RevocationFeed:
    """One subscription per gateway process, fanned out to the sockets of each collector."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @contextlib.contextmanager
    def watch(self, collector_id: str) -> Iterator[asyncio.Event]:
        """An event set when ``collector_id`` is announced revoked while the socket is open."""
        event = asyncio.Event()
        self._waiters[collector_id].add(event)
        try:
            yield event
        finally:
            self._waiters[collector_id].discard(event)
            if not self._waiters[collector_id]:
                del self._waiters[collector_id]

    async def _listen(self) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    async for message in pubsub.listen():
                        if message.get("type") != "message":
                            continue
                        data = message["data"]
                        collector_id = data.decode() if isinstance(data, bytes) else str(data)
                        for event in self._waiters.get(collector_id, ()):
                            event.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis went away: the periodic check covers the gap; resubscribe shortly
                log.warning("revocation subscription lost; retrying", exc_info=True)
                await asyncio.sleep(1.0)
