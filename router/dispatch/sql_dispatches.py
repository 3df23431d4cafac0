"""The SQL of dispatches: the claim's take, what a collector holds, cancels owed, the listing.

* **claim** - ``SELECT ... FOR UPDATE SKIP LOCKED`` on the collector's leased
  dispatches: two concurrent claims never receive the same dispatch."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    RowMapping,
    and_,
    func,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import (
    dispatches,
    tasks,
)
from router.core.sql import Db, sql
from router.core.states import State
from router.core.store import CHANGED_TASKS

_DISPATCH_COLUMNS = frozenset(dispatches.c.keys())
_UPDATE_DISPATCH: dict[tuple[str, ...], str] = {}


async def update_dispatch(conn: Db, dispatch_id: str, **values: Any) -> None:
    columns = tuple(sorted(values))
    query = _UPDATE_DISPATCH.get(columns)
    if query is None:
        unknown = set(columns) - _DISPATCH_COLUMNS
        if unknown:
            raise ValueError(f"not columns of dispatches: {sorted(unknown)}")
        sets = "".join(f", {c} = %(v_{c})s" for c in columns)
        query = _UPDATE_DISPATCH[columns] = (
            f"UPDATE dispatches SET updated_at = now(){sets} WHERE dispatch_id = %(dispatch_id)s"
        )
    await (await sql(conn)).run(query, {"dispatch_id": dispatch_id, **{f"v_{c}": values[c] for c in columns}})


# One statement, one round trip, atomic on its own (it runs outside an explicit transaction):
# lock the oldest unexpired leased dispatches of the collector (up to :limit) together with
# their tasks (SKIP LOCKED on both, so concurrent claims and a concurrent cancel never wait on
# each other), mark them handed out in this numbered claim, move execute tasks leased ->
# dispatched and record it.
_TAKE = """
WITH picked AS (
    SELECT d.dispatch_id, d.task_id, d.kind
    FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
    WHERE d.collector_id = %(collector_id)s AND d.state = 'leased' AND d.expires_at > now()
      AND (CAST(%(providers)s AS text[]) IS NULL OR d.provider = ANY(CAST(%(providers)s AS text[])))
      AND t.protocol_floor <= %(protocol)s
    ORDER BY d.created_at
    LIMIT %(limit)s
    FOR UPDATE OF d, t SKIP LOCKED
), handed AS (
    UPDATE dispatches d
    SET state = 'dispatched', handed_claim_seq = %(claim_seq)s, handed_at = now(), updated_at = now(),
        handed_protocol = %(protocol)s
    FROM picked WHERE d.dispatch_id = picked.dispatch_id
    RETURNING d.dispatch_id, d.task_id, d.kind, d.envelope, d.created_at, d.relayed_credential, d.traceparent
), moved AS (
    UPDATE tasks t SET state = 'dispatched', updated_at = now()
    FROM handed WHERE t.task_id = handed.task_id AND handed.kind = 'execute'
    RETURNING t.task_id, handed.dispatch_id
), recorded AS (
    INSERT INTO task_transitions (task_id, dispatch_id, from_state, to_state, reason)
    SELECT task_id, dispatch_id, 'leased', 'dispatched', 'claimed' FROM moved
)
SELECT dispatch_id, task_id, kind, envelope, created_at, relayed_credential, traceparent FROM handed
ORDER BY created_at
"""


async def take_leased(
    conn: Db,
    collector_id: str,
    claim_seq: int,
    limit: int = 1,
    providers: Sequence[str] | None = None,
    protocol: int = 1,
) -> list[dict[str, Any]]:
    """Hand out up to ``limit`` of the collector's oldest unexpired leased dispatches (``_TAKE``),
    only of ``providers`` when given (those the collector has a free slot for), and only of tasks
    whose protocol floor the claim's settled ``protocol`` reaches (a collector rolled back to an
    older build is not handed work it was placed with under its newer one)."""
    params = {
        "collector_id": collector_id, "claim_seq": claim_seq, "limit": limit,
        "providers": None if providers is None else list(providers), "protocol": protocol,
    }  # fmt: skip
    db = await sql(conn)
    rows = await db.all(_TAKE, params)
    for row in rows:
        if row["kind"] == "execute":
            db.info.setdefault(CHANGED_TASKS, set()).add(row["task_id"])
    return rows


async def leased_to(conn: AsyncConnection, collector_id: str) -> Sequence[RowMapping]:
    """Dispatches leased to the collector and not handed out yet, locked."""
    query = (
        select(*dispatches.c)
        .where(dispatches.c.collector_id == collector_id, dispatches.c.state == State.LEASED.value)
        .with_for_update()
    )
    return (await conn.execute(query)).mappings().all()


# Dispatches of the collector handed out in a claim before %(before)s and still unreported.
HANDED_OUT = """d.collector_id = %(collector)s AND d.state = 'dispatched' AND d.reported_at IS NULL
    AND d.handed_claim_seq > 0 AND d.handed_claim_seq < %(before)s"""


async def handed_out(conn: Db, collector_id: str, before_claim_seq: int) -> list[dict[str, Any]]:
    """Dispatched, unreported dispatches handed out in an earlier numbered claim, locked (skip locked)."""
    return await (await sql(conn)).all(
        f"SELECT * FROM dispatches d WHERE {HANDED_OUT} FOR UPDATE SKIP LOCKED",
        {"collector": collector_id, "before": before_claim_seq},
    )


_HELD = """
SELECT d.dispatch_id, d.kind, d.state, d.reported_at, t.state AS task_state, t.current_dispatch_id,
       t.cancel_requested_at
FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
WHERE d.collector_id = %(collector)s AND d.dispatch_id = ANY(%(held)s)"""


async def held_dispatches(conn: Db, collector_id: str, held: list[str]) -> list[dict[str, Any]]:
    """The collector's dispatches among ``held`` with their tasks' state and cancel request
    (router/dispatch/cancels.py ``verdict``); unlocked: a verdict is advice read at one instant."""
    return await (await sql(conn)).all(_HELD, {"collector": collector_id, "held": held})


_UNANSWERED_CANCELS = """
SELECT d.collector_id, d.dispatch_id
FROM tasks t JOIN dispatches d ON d.dispatch_id = t.current_dispatch_id
WHERE t.state IN ('dispatched', 'running') AND d.reported_at IS NULL
  AND t.cancel_requested_at < now() - make_interval(secs => %(after)s)
LIMIT 1000"""


async def unanswered_cancels(conn: Db, after_s: float) -> list[dict[str, Any]]:
    """Dispatches whose cancel was asked for over ``after_s`` seconds ago and not answered yet."""
    return await (await sql(conn)).all(_UNANSWERED_CANCELS, {"after": after_s})


async def expired_leased_dispatches(conn: AsyncConnection, limit: int) -> Sequence[RowMapping]:
    query = (
        select(*dispatches.c)
        .where(dispatches.c.state == State.LEASED.value, dispatches.c.expires_at <= func.now())
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (await conn.execute(query)).mappings().all()


async def in_flight_dispatches(conn: AsyncConnection, limit: int) -> Sequence[RowMapping]:
    """Handed-out dispatches with their task's deadline, for the liveness and deadline sweep."""
    query = (
        select(*dispatches.c, tasks.c.deadline)
        .join(tasks, tasks.c.task_id == dispatches.c.task_id)
        .where(dispatches.c.state.in_([State.DISPATCHED.value, State.RUNNING.value]))
        .limit(limit)
        .with_for_update(of=dispatches, skip_locked=True)
    )
    return (await conn.execute(query)).mappings().all()


async def list_dispatches(
    conn: AsyncConnection,
    *,
    states: Sequence[str],
    task_states: Sequence[str],
    site_id: str,
    collector_id: str,
    target_ref: str,
    after: tuple[dt.datetime, str] | None,
    limit: int,
    dispatch_id: str = "",
    task_id: str = "",
) -> Sequence[RowMapping]:
    """The dispatch queue, newest first, each row with its task's state as ``task_state``."""
    query = select(*dispatches.c, tasks.c.state.label("task_state")).join(
        tasks, tasks.c.task_id == dispatches.c.task_id
    )
    if dispatch_id:
        query = query.where(dispatches.c.dispatch_id == dispatch_id)
    if task_id:
        query = query.where(dispatches.c.task_id == task_id)
    if states:
        query = query.where(dispatches.c.state.in_(list(states)))
    if task_states:
        query = query.where(tasks.c.state.in_(list(task_states)))
    if site_id:
        query = query.where(dispatches.c.site_id == site_id)
    if collector_id:
        query = query.where(dispatches.c.collector_id == collector_id)
    if target_ref:
        query = query.where(dispatches.c.target_ref == target_ref)
    if after is not None:
        created, dispatch_id = after
        query = query.where(
            or_(
                dispatches.c.created_at < created,
                and_(dispatches.c.created_at == created, dispatches.c.dispatch_id < dispatch_id),
            )
        )
    query = query.order_by(dispatches.c.created_at.desc(), dispatches.c.dispatch_id.desc()).limit(limit)
    return (await conn.execute(query)).mappings().all()
