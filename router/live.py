"""Redis side of the router: liveness, in-flight counters and wake-ups.

Redis is never the source of truth. Liveness is the time of each collector's
last claim; in-flight counters per collector and provider steer placement
(the authoritative capacity check is made in PostgreSQL under a lock); they
are rebuilt from PostgreSQL whenever their marker key is missing, so a Redis
restart or FLUSHALL costs a rebuild, never an over-dispatch. Wake-ups are
pub/sub messages that let a waiting claim return as soon as work is routed to
its collector, without polling the database.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import Connection, event
from sqlalchemy.ext.asyncio import AsyncEngine

from common.fanout import Fanout, text
from common.logs import get_logger
from router.fleet_state import DEAD_AFTER_S

LIVENESS_WINDOW_S = int(DEAD_AFTER_S)  # a collector silent this long is dead: no more placement
_LIVE = "versus:live"
_SESSION = "versus:session:"
# Session details outlive the liveness window long enough for operators to see a dead session.
SESSION_TTL_S = 24 * 3600
# Session ids a newer session of the same collector replaced; their claims are refused.
_SUPERSEDED = "versus:superseded:"
_INFLIGHT = "versus:inflight:"
_BUILT = "versus:inflight:built"
_WAKE = "versus:wake:"

log = get_logger("versus.router.live")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Liveness:
    def __init__(self, redis: Redis, window_s: int = LIVENESS_WINDOW_S):
        self.redis = redis
        self.window_s = window_s

    async def touch(self, collector_id: str, now: float, session: Mapping[str, str] | None = None) -> bool:
        """Record a claim (and what the collector said about itself); True when it just came back."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zscore(_LIVE, collector_id)
        pipe.zadd(_LIVE, {collector_id: now})
        if session:
            fields: dict[str | bytes, str] = {"last_claim": str(now)}
            for key, value in session.items():
                fields[key] = value
            pipe.hset(_SESSION + collector_id, mapping=fields)  # type: ignore[arg-type]
            pipe.expire(_SESSION + collector_id, SESSION_TTL_S)
        previous = (await pipe.execute())[0]
        return previous is None or now - float(previous) > self.window_s

    async def adopt_session(self, collector_id: str, session_id: str, now: float) -> int:
        """Make ``session_id`` the collector's current session: 1 if it just became current, 0 if it
        already was, -1 if a newer session superseded it (its claims are refused from then on)."""
        result = await self.redis.eval(
            _ADOPT_SESSION, 2, _SESSION + collector_id, _SUPERSEDED + collector_id, session_id, str(now),
            str(SESSION_TTL_S),
        )  # fmt: skip
        return int(result)

    async def is_superseded(self, collector_id: str, session_id: str) -> bool:
        return bool(await self.redis.sismember(_SUPERSEDED + collector_id, session_id))

    async def session(self, collector_id: str) -> dict[str, str]:
        """What the collector's last claim said about its session (empty if none in the last day)."""
        raw = await self.redis.hgetall(_SESSION + collector_id)
        return {_text(k): _text(v) for k, v in raw.items()}

    async def forget(self, collector_id: str) -> None:
        """Drop the collector from the live set (it was revoked): placement and the sweeper see it dead."""
        await self.redis.zrem(_LIVE, collector_id)

    async def self_draining(self, collector_ids: Iterable[str]) -> set[str]:
        """Collectors that said on their last claim that they are draining (e.g. before an upgrade)."""
        ids = list(collector_ids)
        if not ids:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for cid in ids:
            pipe.hget(_SESSION + cid, "draining")
        flags = await pipe.execute()
        return {cid for cid, flag in zip(ids, flags, strict=True) if flag == b"1"}

    async def live(self, collector_ids: Iterable[str], now: float) -> set[str]:
        ids = list(collector_ids)
        if not ids:
            return set()
        scores = await self.redis.zmscore(_LIVE, ids)
        return {
            cid
            for cid, score in zip(ids, scores, strict=True)
            if score is not None and now - score <= self.window_s
        }

    async def last_seen(self, collector_id: str) -> float | None:
        score = await self.redis.zscore(_LIVE, collector_id)
        return None if score is None else float(score)


# Atomic so two sessions claiming at once cannot both become current.
_ADOPT_SESSION = """
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return -1 end
local current = redis.call('HGET', KEYS[1], 'session_id')
if current == ARGV[1] then return 0 end
if current then
  redis.call('SADD', KEYS[2], current)
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
redis.call('HSET', KEYS[1], 'session_id', ARGV[1], 'established_at', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


class InFlight:
    """Per-collector, per-provider counters of leased, dispatched and running work."""

    def __init__(self, redis: Redis, load: Callable[[], Awaitable[Mapping[tuple[str, str], int]]]):
        self.redis = redis
        self._load = load
        self._lock = asyncio.Lock()

    async def ensure_built(self) -> None:
        if await self.redis.exists(_BUILT):
            return
        async with self._lock:
            if await self.redis.exists(_BUILT):
                return
            log.info("in-flight counters missing from Redis; rebuilding from PostgreSQL")
            await self.rebuild()

    async def rebuild(self) -> None:
        counts = await self._load()
        per_collector: dict[str, dict[str, int]] = defaultdict(dict)
        for (collector_id, provider), n in counts.items():
            per_collector[collector_id][provider] = n
        pipe = self.redis.pipeline(transaction=True)
        async for key in self.redis.scan_iter(match=f"{_INFLIGHT}*", count=500):
            if key != _BUILT.encode():
                pipe.delete(key)
        for collector_id, providers in per_collector.items():
            pipe.hset(_INFLIGHT + collector_id, mapping=dict(providers))  # type: ignore[arg-type]
        pipe.set(_BUILT, "1")
        await pipe.execute()
        log.debug("in-flight counters rebuilt from PostgreSQL", collectors=len(per_collector))

    async def add(self, collector_id: str, provider: str, delta: int) -> None:
        await self.ensure_built()
        await self.redis.hincrby(_INFLIGHT + collector_id, provider, delta)

    async def get(self, collector_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        await self.ensure_built()
        ids = list(collector_ids)
        pipe = self.redis.pipeline(transaction=False)
        for cid in ids:
            pipe.hgetall(_INFLIGHT + cid)
        rows = await pipe.execute()
        return {
            cid: {k.decode(): max(int(v), 0) for k, v in row.items()}
            for cid, row in zip(ids, rows, strict=True)
        }


class WakeHub(Fanout):
    """Wake-ups by key: collector ids (work was routed to it) and ``task:<id>`` (the task changed state)."""

    def __init__(self, redis: Redis):
        super().__init__(redis, pattern=_WAKE + "*", key_of=lambda m: text(m["channel"]).removeprefix(_WAKE))

    async def publish(self, collector_id: str) -> None:
        await self.redis.publish(_WAKE + collector_id, b"1")

    async def publish_many(self, keys: Iterable[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.publish(_WAKE + key, b"1")
        try:
            await pipe.execute()
        except Exception:  # a missed wake-up only delays a watcher until its fallback poll
            log.warning("task wake-up not published", exc_info=True)


def task_key(task_id: str) -> str:
    """The wake-up key of a task's state changes."""
    return "task:" + task_id


class TaskWakes:
    """Publishes a wake-up for every task a committed transaction moved, so WatchTask does not poll.

    ``router.store.transition`` notes the task id on the connection. The ids move
    to a committed set on the engine's ``commit`` event (dropped on ``rollback``)
    and are published when the connection goes back to the pool: the ``commit``
    event fires *before* the database commits, and a watcher woken then would
    read the old state and sleep until its fallback timer.
    """

    def __init__(self, engine: AsyncEngine, wake: WakeHub, changed_key: str):
        self.wake = wake
        self.changed_key = changed_key
        self.committed_key = changed_key + ":committed"
        self._pending: set[asyncio.Task[None]] = set()
        event.listen(engine.sync_engine, "commit", self._on_commit)
        event.listen(engine.sync_engine, "rollback", self._on_rollback)
        event.listen(engine.sync_engine.pool, "checkin", self._on_checkin)

    def _on_commit(self, conn: Connection) -> None:
        ids = conn.info.pop(self.changed_key, None)
        if ids:
            conn.info.setdefault(self.committed_key, set()).update(ids)

    def _on_rollback(self, conn: Connection) -> None:
        conn.info.pop(self.changed_key, None)

    def _on_checkin(self, dbapi_connection: Any, record: Any) -> None:
        if record is None:
            return
        ids = record.info.pop(self.committed_key, None)
        record.info.pop(self.changed_key, None)
        if not ids:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self.wake.publish_many(task_key(i) for i in ids))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
