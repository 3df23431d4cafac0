"""Audit rows the router writes and the audit log operators read, newest first.

Every write goes through :func:`common.db.audit.record` inside the caller's transaction, so an
action and its audit row commit or roll back together."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Text, and_, cast, func, select
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db import audit as audit_log
from common.db.schema import audit_events


async def record(
    conn: AsyncConnection,
    actor: str,
    action: str,
    subject_type: str,
    subject_id: str,
    details: Mapping[str, Any],
) -> None:
    await audit_log.record(
        conn, service="router", actor=actor, action=action, subject_type=subject_type,
        subject_id=subject_id, details=details,
    )  # fmt: skip


async def list_events(
    conn: AsyncConnection,
    *,
    subject_type: str,
    subject_id: str,
    actor: str,
    action_prefix: str,
    before_id: int | None,
    limit: int,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> Sequence[RowMapping]:
    """Audit events newest first, filtered; ``before_id`` pages backwards."""
    stmt = select(*audit_events.c).order_by(audit_events.c.id.desc()).limit(limit)
    conditions = []
    if subject_type:
        conditions.append(audit_events.c.subject_type == subject_type)
    if subject_id:
        conditions.append(audit_events.c.subject_id == subject_id)
    if actor:
        conditions.append(audit_events.c.actor == actor)
    if action_prefix:
        conditions.append(func.starts_with(audit_events.c.action, cast(action_prefix, Text)))
    if before_id is not None:
        conditions.append(audit_events.c.id < before_id)
    if since is not None:
        conditions.append(audit_events.c.at >= since)
    if until is not None:
        conditions.append(audit_events.c.at < until)
    if conditions:
        stmt = stmt.where(and_(*conditions))
    return (await conn.execute(stmt)).mappings().all()
