"""The loop that moves each sink's cursor: read the next rows, deliver them, move the cursor.

Every router runs it for every configured sink; the cursor row's lock makes one of them the
exporter of a sink at a time (router/audit_export/outbox.py). A sink that fails is offered the
same batch again after a backoff (1 s doubling to 30 s), for as long as it takes: nothing is
skipped, so a sink that stays down holds its events in PostgreSQL, where the audit log keeps them
anyway, and ``versus_audit_export_oldest_undelivered_age_seconds`` grows (an alert watches it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from prometheus_client import Counter, Gauge
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from common.telemetry.logs import get_logger
from router.audit_export import events, outbox
from router.audit_export.sinks import Sink, SinkUnavailable

POLL_S = 1.0
MAX_BACKOFF_S = 30.0

DELIVERED = Counter("versus_audit_export_delivered_total", "Audit events delivered, by sink.", ["sink"])
FAILURES = Counter(
    "versus_audit_export_failures_total", "Deliveries that failed and will be retried.", ["sink"]
)
OLDEST = Gauge(
    "versus_audit_export_oldest_undelivered_age_seconds",
    "Age of the oldest audit event the sink has not had (0: none waiting), sampled by the exporting router.",
    ["sink"],
)
_OLDEST = text(
    """
    SELECT extract(epoch FROM now() - e.at) FROM audit_events e, audit_export_cursors c
    WHERE c.sink = :sink AND (e.xid, e.id) > (c.xid, c.event_id) ORDER BY e.xid, e.id LIMIT 1
    """
)

log = get_logger("versus.router.audit_export")


class Exporter:
    """Delivers the audit log to ``sinks`` until stopped."""

    def __init__(self, engine: AsyncEngine, sinks: Sequence[Sink], source: str, batch: int = 200):
        self.engine, self.sinks, self.source, self.batch = engine, list(sinks), source, batch
        for sink in self.sinks:
            DELIVERED.labels(sink.name)
            FAILURES.labels(sink.name)

    async def run(self, stop: asyncio.Event) -> None:
        if not self.sinks:
            return
        log.info("exporting the audit log", sinks=[s.name for s in self.sinks])
        try:
            await asyncio.gather(*(self._run(sink, stop) for sink in self.sinks))
        finally:
            for sink in self.sinks:
                await sink.close()

    async def _run(self, sink: Sink, stop: asyncio.Event) -> None:
        failures = 0
        ensured = False
        while not stop.is_set():
            try:
                if not ensured:  # the sink's cursor exists (a new sink starts at the log's beginning)
                    async with self.engine.begin() as conn:
                        await outbox.ensure(conn, sink.name)
                    ensured = True
                moved = await self.once(sink)
                if failures:
                    log.info("audit export resumed", sink=sink.name)
                failures = 0
                if moved == self.batch:
                    continue  # more are waiting
                pause = POLL_S
            except (SinkUnavailable, OSError, DBAPIError) as exc:  # the sink, or PostgreSQL, is away
                FAILURES.labels(sink.name).inc()
                if failures == 0 or failures % 10 == 0:
                    log.warning(
                        "audit export failed; retrying",
                        sink=sink.name,
                        reason=str(exc),
                        failures=failures + 1,
                    )
                failures += 1
                pause = min(2.0 ** (failures - 1), MAX_BACKOFF_S)
            except Exception:
                log.exception("audit export failed unexpectedly; retrying", sink=sink.name)
                failures += 1
                pause = MAX_BACKOFF_S
            await self._sample(sink)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await stop.wait()

    async def once(self, sink: Sink) -> int:
        """Deliver the next batch to ``sink`` if this router holds its cursor; how many were delivered."""
        async with self.engine.begin() as conn:
            at = await outbox.hold(conn, sink.name)
            if at is None:
                return 0  # another router is exporting to this sink
            rows = await outbox.next_rows(conn, at, self.batch)
            if not rows:
                return 0
            await sink.deliver([events.cloud_event(r, self.source) for r in rows])
            last = rows[-1]
            await outbox.move(conn, sink.name, outbox.Position(int(last["xid"]), int(last["id"])), len(rows))
        DELIVERED.labels(sink.name).inc(len(rows))
        return len(rows)

    async def _sample(self, sink: Sink) -> None:
        with contextlib.suppress(Exception):
            async with self.engine.connect() as conn:
                age = (await conn.execute(_OLDEST, {"sink": sink.name})).scalar()
            OLDEST.labels(sink.name).set(float(age) if age is not None else 0.0)
