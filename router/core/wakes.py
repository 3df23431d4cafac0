"""Wake-ups over Redis pub/sub: a waiting claim or WatchTask returns as soon as work is routed to its
collector or its task moves, without polling PostgreSQL (router/core/live.py holds liveness and
in-flight counters)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import Connection, event
from sqlalchemy.ext.asyncio import AsyncEngine

from common.redis.fanout import KeyedFanout
from common.redis.keys import CANDIDATES_CHANGED, WAKE, WORK, WORK_NOTE, WORK_NOTE_MS, WORK_TEXT
from common.telemetry.logs import get_logger
from router.core.metrics import TASK_OUTCOMES

log = get_logger("versus.router.live")

# Collectors whose last work announcement this process remembers; past it the notes start over.
MAX_WORK_NOTES = 1_000_000


class WakeHub(KeyedFanout):
    """Wake-ups by key: collector ids (work was routed to it) and ``task:<id>`` (the task changed
    state). Each router replica subscribes only to the keys it waits on now (common/redis/fanout.py
    :class:`KeyedFanout`): the collectors whose claims it holds and the tasks it watches."""

    def __init__(self, redis: Redis):
        super().__init__(redis, prefix=WAKE, always=(CANDIDATES_CHANGED,))
        # When work was last announced for each collector (monotonic seconds), as far as this
        # process heard, and when a claim of it last took something.
        self._work_at: dict[str, float] = {}
        self._taken_at: dict[str, float] = {}

    def wake(self, key: str, payload: str = "") -> None:
        if payload == WORK_TEXT:
            if len(self._work_at) >= MAX_WORK_NOTES:
                self._work_at.clear()
            self._work_at[key] = time.monotonic()
        super().wake(key, payload)

    def work_announced_since(self, collector_id: str, since: float) -> bool:
        """Whether work was announced for the collector at or after ``since`` (``time.monotonic()``)
        and after its claims last took anything (that work may still be waiting)."""
        announced = self._work_at.get(collector_id, -1.0)
        return announced >= since and announced > self._taken_at.get(collector_id, -1.0)

    def taken(self, collector_id: str) -> None:
        """Note that a claim of the collector just took work."""
        if len(self._taken_at) >= MAX_WORK_NOTES:
            self._taken_at.clear()
        self._taken_at[collector_id] = time.monotonic()

    async def publish(self, collector_id: str, payload: bytes = b"1") -> None:
        """Wake the collector's waiting claim. ``WORK`` says only that work was routed to it (and
        is noted for a claim about to start: Liveness.heartbeat ``work_noted``); anything else
        (the default) also makes the claim re-check the collector's standing."""
        if payload != WORK:
            await self.redis.publish(WAKE + collector_id, payload)
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(WORK_NOTE + collector_id, b"1", px=WORK_NOTE_MS)
        pipe.publish(WAKE + collector_id, payload)
        await pipe.execute()

    async def publish_many(self, keys: Iterable[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.publish(WAKE + key, b"1")
        try:
            await pipe.execute()
        except Exception:  # a missed wake-up only delays a watcher until its fallback poll
            log.warning("task wake-up not published", exc_info=True)


def task_key(task_id: str) -> str:
    """The wake-up key of a task's state changes."""
    return "task:" + task_id


class TaskWakes:
    """Publishes a wake-up for every task a committed transaction moved, so WatchTask does not poll.

    ``router.dispatch.sql_tasks.transition`` notes the task id on the connection. The ids move
    to a committed set on the engine's ``commit`` event (dropped on ``rollback``)
    and are published when the connection goes back to the pool: the ``commit``
    event fires *before* the database commits, and a watcher woken then would
    read the old state and sleep until its fallback timer. On an autocommit
    connection each statement commits by itself and the closing "rollback"
    counts as the commit.
    """

    def __init__(self, engine: AsyncEngine, wake: WakeHub, changed_key: str, outcomes_key: str = ""):
        self.wake = wake
        self.changed_key = changed_key
        self.committed_key = changed_key + ":committed"
        # The same journey for the outcomes a transaction reached: counted once committed.
        self.outcomes_key = outcomes_key
        self.committed_outcomes = outcomes_key + ":committed"
        self._pending: set[asyncio.Task[None]] = set()
        event.listen(engine.sync_engine, "commit", self._on_commit)
        event.listen(engine.sync_engine, "rollback", self._on_rollback)
        event.listen(engine.sync_engine.pool, "checkin", self._on_checkin)

    def _on_commit(self, conn: Connection) -> None:
        if conn.invalidated:
            return
        ids = conn.info.pop(self.changed_key, None)
        if ids:
            conn.info.setdefault(self.committed_key, set()).update(ids)
        outcomes = conn.info.pop(self.outcomes_key, None)
        if outcomes:
            conn.info.setdefault(self.committed_outcomes, []).extend(outcomes)

    def _on_rollback(self, conn: Connection) -> None:
        if conn.invalidated:
            # The connection was lost (a database restart): touching ``info`` now would raise
            # PendingRollbackError from inside the rollback and hide the real error. Its
            # record's ids are dropped at checkin.
            return
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            # Each statement committed on its own; the "rollback" at close undoes nothing.
            self._on_commit(conn)
            return
        conn.info.pop(self.changed_key, None)
        conn.info.pop(self.outcomes_key, None)

    def _on_checkin(self, dbapi_connection: Any, record: Any) -> None:
        if record is None:
            return
        ids = record.info.pop(self.committed_key, None)
        record.info.pop(self.changed_key, None)
        record.info.pop(self.outcomes_key, None)
        for op_class, state in record.info.pop(self.committed_outcomes, ()):
            TASK_OUTCOMES.labels(op_class, state).inc()
        if not ids:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self.wake.publish_many(task_key(i) for i in ids))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
