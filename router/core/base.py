"""The router's shared state and types: one :class:`RouterCore` per process, extended by the
placement, hand-out, outcome, report and sweep layers (router/dispatch/service.py puts them together).

Each operation is one PostgreSQL transaction; Redis side effects (in-flight counters, wake-ups)
run after it commits (:class:`Effects`)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from common import limits
from common.db.fleet_clock import FleetClock
from common.telemetry.logs import get_logger
from router.core import store
from router.core.live import InFlight, Liveness
from router.core.sql import Row
from router.core.states import State
from router.core.wakes import TaskWakes, WakeHub

S = State
log = get_logger("versus.router")

Effect = Callable[[], Awaitable[object]]


@dataclass
class Effects:
    """What an operation's transaction did besides its writes: Redis updates to run once it has
    committed, and the task rows as its transitions left them (the caller's answer, not read again)."""

    pending: list[Effect] = field(default_factory=list)
    rows: dict[str, Row] = field(default_factory=dict)

    def add(self, effect: Effect) -> None:
        self.pending.append(effect)

    def moved(self, row: Row | None) -> None:
        """Note a task row a transition returned."""
        if row is not None:
            self.rows[row["task_id"]] = row

    async def run(self) -> None:
        for effect in self.pending:
            try:
                await effect()
            except Exception:  # Redis is advisory: a lost update is repaired by the next rebuild
                log.warning("post-commit redis update failed", exc_info=True)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class RouterCore:
    """Connections, caches and background tasks every layer of the router shares."""

    def __init__(self, engine: AsyncEngine, redis: Redis):
        self.engine = engine
        # Single statements that need no transaction (reads, the claim's take) run in autocommit:
        # no BEGIN and COMMIT round trips on the hot path.
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.redis = redis
        # Streamed output bounds and retention (router/output/streams.py); the server sets them
        # from settings.
        self.output_task_limit = limits.OUTPUT_TASK_LIMIT_BYTES
        self.output_tenant_quota = limits.OUTPUT_TENANT_QUOTA_BYTES
        self.output_retention_s = float(limits.OUTPUT_RETENTION_S)
        # Vault mode B's store (router/credentials/store.py); set by the server.
        self.credential_store: Any = None
        # Liveness times are written by one replica and read by another: one clock (PostgreSQL's).
        self.clock = FleetClock()
        self.liveness = Liveness(redis)
        self.in_flight = InFlight(redis, self._load_in_flight)
        self.wake = WakeHub(redis)
        self.task_wakes = TaskWakes(engine, self.wake, store.CHANGED_TASKS, store.TASK_OUTCOMES)
        self._background: set[asyncio.Task[Any]] = set()
        # Set by the server when this process also serves tunnels (router/tunnels/broker.py).
        self.tunnels: Any = None
        # Set by the server: the enrollment service, owner of collector status
        # (router/fleet/enrollment_client.py).
        self.enrollment: Any = None
        # Set by the server: releases and upgrade targets (router/releases/publishing.py,
        # router/releases/updates.py).
        self.releases: Any = None
        self.updates: Any = None

    async def _load_in_flight(self) -> Mapping[tuple[str, str], int]:
        async with self.engine.connect() as conn:
            return await store.all_in_flight(conn)

    def _in_background(self, start: Effect) -> Effect:
        """An effect that starts ``start`` without waiting for it (the caller's answer goes first)."""

        async def run() -> None:
            self._spawn(start())

        return run

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def start(self) -> None:
        """Start listening for wake-ups and following the fleet clock."""
        self.wake.start()
        self._spawn(self.clock.run(self.engine))

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.wake.stop()

    async def aclose(self) -> None:
        """Stop background work and close the connections this router was given."""
        await self.close()
        await self.redis.aclose()
        if self.enrollment is not None:
            await self.enrollment.close()
        await self.engine.dispose()
