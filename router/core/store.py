"""SQL every subsystem of the router reads: a task, a dispatch, the dispatch keys a collector holds,
the in-flight counts behind placement, and the task audit rows. The dispatch subsystem's own
SQL is in router/dispatch/sql_*.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    func,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db import audit as audit_log
from common.db.schema import (
    collectors,
    dispatches,
)
from common.errors import NotFound
from router.core.sql import Db, sql
from router.core.states import IN_FLIGHT

IN_FLIGHT_VALUES = [s.value for s in IN_FLIGHT]
# Connection.info key: ids of tasks this transaction moved (published on commit).
CHANGED_TASKS = "versus_changed_tasks"
# (op_class, state) of each task a transaction moved into a final state (or to an operator), counted
# once the transaction has committed (router/core/wakes.py TaskWakes).
TASK_OUTCOMES = "versus_task_outcomes"


_GET_TASK = {
    (False, False): "SELECT * FROM tasks WHERE task_id = %(id)s",
    (True, False): "SELECT * FROM tasks WHERE task_id = %(id)s FOR UPDATE",
    (True, True): "SELECT * FROM tasks WHERE task_id = %(id)s FOR UPDATE SKIP LOCKED",
    (False, True): "SELECT * FROM tasks WHERE task_id = %(id)s",
}


async def get_task(
    conn: Db, task_id: str, *, lock: bool = False, skip_locked: bool = False
) -> dict[str, Any] | None:
    return await (await sql(conn)).one(_GET_TASK[(lock, skip_locked)], {"id": task_id})


async def all_in_flight(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    result = await conn.execute(
        select(dispatches.c.collector_id, dispatches.c.provider, func.count())
        .where(dispatches.c.state.in_(IN_FLIGHT_VALUES))
        .group_by(dispatches.c.collector_id, dispatches.c.provider)
    )
    return {(row[0], row[1]): int(row[2]) for row in result}


async def collector_dispatch_kids(conn: AsyncConnection, collector_id: str) -> list[str] | None:
    """The dispatch kids the collector holds (None: enrolled before they were recorded)."""
    query = select(collectors.c.dispatch_kids).where(collectors.c.collector_id == collector_id)
    kids = (await conn.execute(query)).scalar_one_or_none()
    return None if kids is None else list(kids)


async def get_dispatch(conn: Db, dispatch_id: str, *, lock: bool = False) -> dict[str, Any] | None:
    query = "SELECT * FROM dispatches WHERE dispatch_id = %(id)s" + (" FOR UPDATE" if lock else "")
    return await (await sql(conn)).one(query, {"id": dispatch_id})


async def audit(
    conn: AsyncConnection, actor: str, action: str, task_id: str, details: Mapping[str, Any]
) -> None:
    await audit_log.record(
        conn, service="router", actor=actor, action=action, subject_type="task", subject_id=task_id,
        details=details,
    )  # fmt: skip


async def require_collector(conn: Db, collector_id: str) -> None:
    """Raise ``collector_not_found`` unless the collector exists (any status)."""
    found = await (await sql(conn)).scalar(
        "SELECT 1 FROM collectors WHERE collector_id = %(id)s", {"id": collector_id}
    )
    if found is None:
        raise NotFound(f"collector {collector_id!r} does not exist", code="collector_not_found")
