"""The SQL of device leases: one writer per device, and the fence an earlier writer leaves.

* **lease acquire** - one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` on the
  device's lease row: it succeeds only when nobody holds the device (or the
  holder's lease expired) and no earlier writer's fence is running, and bumps
  the epoch, which therefore only grows.
* **lease release** - the row keeps ``fenced_until``: the end of the fence of
  every envelope the holder had out and never heard back from."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Interval,
    func,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import (
    device_leases,
    dispatches,
    tasks,
)
from common.envelope.fence import FENCE_S
from router.core.sql import Db, sql
from router.core.states import State
from router.core.store import IN_FLIGHT_VALUES


@dataclass(frozen=True, slots=True)
class LeaseHeld:
    """Why a device could not be leased: another task holds it, or an earlier writer's fence runs."""

    holder_task_id: str
    fenced_until: dt.datetime | None = None


def release_sql(target_param: str, *, skip_answered: bool) -> str:
    """Release ``%(task_id)s``'s lease of the device ``%(<target_param>)s``, keeping the fence of its
    unanswered envelopes: the plain-SQL twin of :func:`_fence_of`. With ``skip_answered`` the
    dispatch ``%(dispatch_id)s``, answered in the same statement (which does not see its own
    update), is left out of the fence by name."""
    return release_sql_of(f"%({target_param})s", "%(task_id)s", skip_answered=skip_answered)


def release_sql_of(target: str, task: str, *, skip_answered: bool, source: str = "") -> str:
    """:func:`release_sql` for a device and task given as SQL expressions, read from ``source``
    (a ``FROM`` clause: the rows of an earlier part of the same statement)."""
    skip = " AND d.dispatch_id <> %(dispatch_id)s" if skip_answered else ""
    return f"""
    UPDATE device_leases
    SET holder_task_id = NULL, holder_dispatch_id = NULL, collector_id = NULL, expires_at = NULL,
        fenced_until = greatest(device_leases.fenced_until, (
            SELECT max(d.expires_at) + interval '{FENCE_S} seconds' FROM dispatches d
            WHERE d.task_id = {task} AND d.handed_at IS NOT NULL AND d.reported_at IS NULL
              AND d.state <> 'expired' AND d.op_class <> 'read'{skip})){source}
    WHERE device_leases.target_ref = {target} AND device_leases.holder_task_id = {task}"""


_ACQUIRE_LEASE = """
INSERT INTO device_leases AS l (target_ref, epoch, holder_task_id, collector_id, acquired_at, expires_at)
VALUES (%(target)s, 1, %(task)s, %(collector)s, now(), %(expires)s)
ON CONFLICT (target_ref) DO UPDATE
SET epoch = l.epoch + 1, holder_task_id = %(task)s, holder_dispatch_id = NULL, collector_id = %(collector)s,
    acquired_at = now(), expires_at = %(expires)s
WHERE (l.holder_task_id IS NULL OR l.holder_task_id = %(task)s OR l.expires_at < now())
  AND (l.fenced_until IS NULL OR l.fenced_until <= now())
RETURNING l.epoch"""


async def acquire_lease(
    conn: Db, target_ref: str, task_id: str, collector_id: str | None, expires_at: dt.datetime
) -> int | LeaseHeld:
    """The new epoch, or why the device is not available. Re-acquiring by the same task keeps working.

    A device is available when nobody holds it (or the holder's lease ran out) and no earlier
    writer's fence is running (``fenced_until``, set on release: see :func:`release_lease`).
    ``expires_at`` must itself cover the fence of the holder's last envelope.
    """
    db = await sql(conn)
    params = {"target": target_ref, "task": task_id, "collector": collector_id, "expires": expires_at}
    epoch = await db.scalar(_ACQUIRE_LEASE, params)
    if epoch is not None:
        return int(epoch)
    holder = await db.one(
        "SELECT holder_task_id, fenced_until FROM device_leases WHERE target_ref = %(t)s", {"t": target_ref}
    )
    assert holder is not None
    return LeaseHeld(holder["holder_task_id"] or "", holder["fenced_until"])


def _fence_of(task_id: Any) -> Any:
    """When the last unanswered envelope handed out for ``task_id`` can no longer write (or NULL).

    Unanswered: handed out, never reported, and not provably unreceived (``expired``). Reads
    change nothing, so they fence nothing.
    """
    return (
        select(func.max(dispatches.c.expires_at) + literal_column(f"interval '{FENCE_S} seconds'", Interval))
        .where(
            dispatches.c.task_id == task_id,
            dispatches.c.handed_at.is_not(None),
            dispatches.c.reported_at.is_(None),
            dispatches.c.state != State.EXPIRED.value,
            dispatches.c.op_class != "read",
        )
        .scalar_subquery()
    )


_RELEASED = {"holder_task_id": None, "holder_dispatch_id": None, "collector_id": None, "expires_at": None}


_RELEASE_LEASE = release_sql("target", skip_answered=False)


async def release_lease(conn: Db, target_ref: str, task_id: str) -> None:
    """Release the device if this task holds it; the row (and its epoch) stays.

    The row keeps a fence: no other writer gets the device before every envelope this
    task had handed out and not heard back from is past ``expires_at`` + FENCE_S.
    """
    await (await sql(conn)).run(_RELEASE_LEASE, {"target": target_ref, "task_id": task_id})


async def lease_holder(conn: Db, target_ref: str) -> dict[str, Any] | None:
    return await (await sql(conn)).one(
        "SELECT * FROM device_leases WHERE target_ref = %(t)s", {"t": target_ref}
    )


async def orphan_leases(conn: AsyncConnection) -> int:
    """Release leases whose holder task is no longer in flight or whose time ran out."""
    live_holders = select(tasks.c.task_id).where(
        tasks.c.state.in_(
            [
                *IN_FLIGHT_VALUES,
                State.QUEUED.value,
                State.ROUTED.value,
                State.UNKNOWN.value,
                State.RECONCILING.value,
            ]
        )
    )
    result = await conn.execute(
        update(device_leases)
        .where(
            device_leases.c.holder_task_id.is_not(None),
            or_(
                device_leases.c.holder_task_id.not_in(live_holders), device_leases.c.expires_at <= func.now()
            ),
        )
        .values(
            **_RELEASED,
            fenced_until=func.greatest(
                device_leases.c.fenced_until, _fence_of(device_leases.c.holder_task_id)
            ),
        )
    )
    return int(result.rowcount or 0)
