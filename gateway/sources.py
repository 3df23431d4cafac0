"""How many collectors each client address has recently been seen with: the per-address allowance
of not-yet-authenticated connections grows with it (docs/gateway.md, "Edge limits").

A fleet behind one NAT address reconnects together after a gateway restart: a fixed per-address
cap on connections still in their TLS handshake or first request (gateway/edge.py) either
refuses part of that fleet or is too loose to stop one anonymous client. So the cap is
``base + collectors seen from the address in the last 15 to 30 minutes``: an address earns room
only with collectors that proved who they are (a valid bearer token), so an anonymous client
gains nothing, and a customer's NAT keeps room for its whole fleet.

The count must outlive the gateway process — the storm it is for starts with a gateway that just
restarted — so each gateway adds the (address, collector) pairs it authenticates to a Redis
HyperLogLog per address and 15-minute bucket (at most once a second, one pipeline), and reads the
counts (the union of the current and the previous bucket) when it starts and every
:data:`REFRESH_S` after. Admission reads only this process's memory: no Redis or PostgreSQL read
per connection. Redis unreachable: the last counts stay (at start: none, the base cap alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from redis.asyncio import Redis

from common.runtime.tasks import cancel_and_wait
from common.telemetry.logs import get_logger

log = get_logger("versus.gateway.sources")

BUCKET_S = 900
# Refresh of the counts from Redis, and flush of the pairs seen since the last one.
REFRESH_S = 10.0
FLUSH_S = 1.0
# A start waits at most this long for the counts before serving.
START_READ_S = 2.0
# At most this many (address, collector) pairs wait for a flush; more are dropped (counted later).
MAX_PENDING = 50_000
# Room an address can earn at most, beyond the base cap (the process's connection limit applies too).
MAX_EARNED = 100_000
KEY_PREFIX = "versus:gateway:sources:"


def bucket_of(now: float) -> int:
    return int(now // BUCKET_S)


def key(bucket: int, source: str) -> str:
    return f"{KEY_PREFIX}{bucket}:{source}"


def source_of(redis_key: str) -> tuple[int, str] | None:
    """(bucket, address) of a key written by :func:`key`, or None."""
    rest = redis_key.removeprefix(KEY_PREFIX)
    bucket, sep, source = rest.partition(":")
    if rest == redis_key or not sep or not bucket.isdigit() or not source:
        return None
    return int(bucket), source


def allowance(base: int, earned: int) -> int:
    """Not-yet-authenticated connections one address may hold: ``base`` (0: no cap) plus what its
    recently seen collectors earned it (at most :data:`MAX_EARNED`)."""
    if base <= 0:
        return 2**62
    return base + min(max(earned, 0), MAX_EARNED)


class SourceCounts:
    """Collectors recently seen per client address, shared through Redis; read by the edge."""

    def __init__(self, redis: Redis, clock: Callable[[], float] = time.time):
        self._redis = redis
        self._clock = clock
        # Per address, how many collectors were seen from it: what admission reads.
        self.earned: dict[str, int] = {}
        self._pending: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None

    def seen(self, source: str, collector_id: str) -> None:
        """A connection from ``source`` authenticated as ``collector_id`` (no I/O here)."""
        if len(self._pending) < MAX_PENDING:
            self._pending.add((source, collector_id))

    async def start(self) -> None:
        """Read the counts once (a restarted gateway needs them for the storm it is about to
        meet; at most :data:`START_READ_S`), then keep them fresh."""
        try:
            async with asyncio.timeout(START_READ_S):
                await self.refresh()
        except Exception as exc:
            log.warning("source counts not read at start", error=type(exc).__name__)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(Exception):
            await self.flush()  # what this process saw last, for the one that starts next

    async def _run(self) -> None:
        next_refresh = time.monotonic() + REFRESH_S
        while True:
            try:
                await self.flush()
                if time.monotonic() >= next_refresh:
                    await self.refresh()
                    next_refresh = time.monotonic() + REFRESH_S
            except Exception as exc:  # Redis away: keep the counts we have, try again
                log.warning("source counts not shared", error=type(exc).__name__)
                next_refresh = time.monotonic() + REFRESH_S
            await asyncio.sleep(FLUSH_S)

    async def flush(self) -> None:
        """Add the pairs seen since the last flush to this bucket's counts in Redis."""
        if not self._pending:
            return
        pending, self._pending = self._pending, set()
        bucket = bucket_of(self._clock())
        by_source: dict[str, list[str]] = {}
        for source, collector_id in pending:
            by_source.setdefault(source, []).append(collector_id)
        ordered = sorted(by_source)
        async with self._redis.pipeline(transaction=False) as pipe:
            for source in ordered:
                pipe.pfadd(key(bucket, source), *by_source[source])
                pipe.expire(key(bucket, source), 2 * BUCKET_S + 60)
                # Counted again at once (with every gateway's additions), not at the next refresh.
                pipe.pfcount(key(bucket, source), key(bucket - 1, source))
            replies = await pipe.execute()
        for source, count in zip(ordered, replies[2::3], strict=True):
            self.earned[source] = int(count)

    async def refresh(self) -> None:
        """Read every address's count: its collectors in this bucket and the one before."""
        bucket = bucket_of(self._clock())
        sources: set[str] = set()
        async for raw in self._redis.scan_iter(match=KEY_PREFIX + "*", count=1000):
            parsed = source_of(raw.decode() if isinstance(raw, bytes) else raw)
            if parsed is not None and parsed[0] in (bucket, bucket - 1):
                sources.add(parsed[1])
        if not sources:
            self.earned = {}
            return
        ordered = sorted(sources)
        async with self._redis.pipeline(transaction=False) as pipe:
            for source in ordered:
                pipe.pfcount(key(bucket, source), key(bucket - 1, source))
            counts = await pipe.execute()
        self.earned = {s: int(n) for s, n in zip(ordered, counts, strict=True) if n}
