"""The task list operators browse: tasks in every state, newest first, with the filters the console
and ``versus-cp tasks list`` offer.

Rows are ordered by ``(created_at, task_id)`` descending and paged by keyset (the last row of a
page is where the next begins), so a page costs the same on the first page as on the thousandth;
``ix_tasks_created_at_task_id`` and ``ix_tasks_site_id_created_at`` serve the unfiltered and the
per-site listings (migration 0022). The big columns (parameters, result, evidence) are left out:
a listing shows what each task is and where it stands, GetTask the rest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import and_, literal, or_, select
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import dispatches, tasks

_LISTED = [c for c in tasks.c if c.name not in ("params", "result", "evidence", "request_sha256")]


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """What a listing is narrowed to; empty fields do not narrow it."""

    states: Sequence[str] = ()
    site_id: str = ""
    tenant_id: str = ""
    provider: str = ""
    operation: str = ""
    target_ref: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    # The caller's tenant scope (None: every tenant).
    tenants: frozenset[str] | None = None


async def list_tasks(
    conn: AsyncConnection, where: TaskFilter, after: tuple[dt.datetime, str] | None, limit: int
) -> Sequence[RowMapping]:
    """Up to ``limit`` tasks matching ``where``, newest first, after the keyset position ``after``."""
    query = select(
        *_LISTED,
        literal(None).label("result"),
        literal("").label("evidence"),
        dispatches.c.output_length,
        dispatches.c.output_sha256,
        # The current attempt's collector: the list links each task to where it runs or ran.
        dispatches.c.collector_id,
    ).outerjoin(dispatches, dispatches.c.dispatch_id == tasks.c.current_dispatch_id)
    if where.states:
        query = query.where(tasks.c.state.in_(list(where.states)))
    for column, value in (
        (tasks.c.site_id, where.site_id),
        (tasks.c.tenant_id, where.tenant_id),
        (tasks.c.provider, where.provider),
        (tasks.c.operation, where.operation),
        (tasks.c.target_ref, where.target_ref),
    ):
        if value:
            query = query.where(column == value)
    if where.labels:
        query = query.where(tasks.c.labels.contains(dict(where.labels)))
    if where.created_after is not None:
        query = query.where(tasks.c.created_at >= where.created_after)
    if where.created_before is not None:
        query = query.where(tasks.c.created_at < where.created_before)
    if where.tenants is not None:
        query = query.where(tasks.c.tenant_id.in_(sorted(where.tenants)))
    if after is not None:
        created, task_id = after
        query = query.where(
            or_(tasks.c.created_at < created, and_(tasks.c.created_at == created, tasks.c.task_id < task_id))
        )
    query = query.order_by(tasks.c.created_at.desc(), tasks.c.task_id.desc()).limit(limit)
    return (await conn.execute(query)).mappings().all()
