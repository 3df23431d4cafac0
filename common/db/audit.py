"""Writing audit rows: one helper every service's store calls inside its own transaction.

The row carries the request id bound to the current log context, so an audit
entry can be matched with the log lines of the call that caused it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection
from structlog.contextvars import get_contextvars

from common.db.schema import audit_events


async def record(
    conn: AsyncConnection,
    *,
    service: str,
    actor: str,
    action: str,
    subject_type: str,
    subject_id: str,
    details: Mapping[str, Any],
) -> None:
    """Append one audit event in ``conn``'s transaction (it commits or rolls back with the change)."""
    request_id = get_contextvars().get("request_id")
    await conn.execute(
        insert(audit_events).values(
            service=service,
            actor=actor,
            action=action,
            subject_type=subject_type,
            subject_id=subject_id,
            request_id=request_id if isinstance(request_id, str) else None,
            details=dict(details),
        )
    )
