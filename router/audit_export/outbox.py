"""The audit log as each sink's outbox: a cursor per sink, and the next rows after it, in commit order.

Rows are read in ``(xid, id)`` order — the writing transaction's id, then the row's — and only
rows whose transaction is older than every transaction still running
(``pg_snapshot_xmin(pg_current_snapshot())``): all of those have committed or rolled back, and any
row written later belongs to a newer transaction, so it sorts after every row already delivered.
Plain ``id`` order would not do: a transaction that took id 100 can commit after one that took
101, and a cursor past 101 would skip 100 for ever.

One exporter at a time per sink, on any number of routers: the batch is read and the cursor moved
in one transaction that holds the sink's cursor row (``FOR UPDATE SKIP LOCKED``: another router
holding it means this one has nothing to do now). The rows are delivered while it is held; the
cursor moves only after the sink has them, so a crash in between delivers them again (at least
once, the event id the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_ENSURE = text("INSERT INTO audit_export_cursors (sink) VALUES (:sink) ON CONFLICT (sink) DO NOTHING")
_HOLD = text("SELECT xid, event_id FROM audit_export_cursors WHERE sink = :sink FOR UPDATE SKIP LOCKED")
_NEXT = text(
    """
    SELECT id, xid, at, service, actor, action, subject_type, subject_id, request_id, details
    FROM audit_events
    WHERE (xid, id) > (:xid, :event_id)
      AND xid < (pg_snapshot_xmin(pg_current_snapshot())::text)::bigint
    ORDER BY xid, id
    LIMIT :limit
    """
)
_MOVE = text(
    """
    UPDATE audit_export_cursors
    SET xid = :xid, event_id = :event_id, delivered = delivered + :count, updated_at = now()
    WHERE sink = :sink
    """
)
_BEHIND = text(
    """
    SELECT count(*) FROM audit_events e, audit_export_cursors c
    WHERE c.sink = :sink AND (e.xid, e.id) > (c.xid, c.event_id)
    """
)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a sink has got to: the last delivered row's transaction id and id (0, 0: nothing yet)."""

    xid: int
    event_id: int


async def ensure(conn: AsyncConnection, sink: str) -> None:
    """The sink's cursor exists (a new sink starts at the beginning of the audit log)."""
    await conn.execute(_ENSURE, {"sink": sink})


async def hold(conn: AsyncConnection, sink: str) -> Position | None:
    """Lock the sink's cursor for this transaction; None when another exporter holds it."""
    row = (await conn.execute(_HOLD, {"sink": sink})).first()
    return None if row is None else Position(int(row.xid), int(row.event_id))


async def next_rows(conn: AsyncConnection, after: Position, limit: int) -> Sequence[Any]:
    """The next committed rows after ``after``, in commit order."""
    params = {"xid": after.xid, "event_id": after.event_id, "limit": limit}
    return (await conn.execute(_NEXT, params)).mappings().all()


async def move(conn: AsyncConnection, sink: str, to: Position, count: int) -> None:
    """Record that the sink has every row up to ``to``."""
    await conn.execute(_MOVE, {"sink": sink, "xid": to.xid, "event_id": to.event_id, "count": count})


async def behind(conn: AsyncConnection, sink: str) -> int:
    """How many audit rows the sink has not had yet (committed or not)."""
    return int((await conn.execute(_BEHIND, {"sink": sink})).scalar_one())
