"""All of the router's SQL, in one place.

Hot paths and why they are safe with several router replicas:

* **claim** - ``SELECT ... FOR UPDATE SKIP LOCKED`` on the collector's leased
  dispatches: two concurrent claims never receive the same dispatch.
* **lease acquire** - one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` on the
  device's lease row: it succeeds only when nobody holds the device (or the
  holder's lease expired) and no earlier writer's fence is running, and bumps
  the epoch, which therefore only grows.
* **lease release** - the row keeps ``fenced_until``: the end of the fence of
  every envelope the holder had out and never heard back from.
* **capacity** - the collector's capabilities row is locked ``FOR UPDATE``
  while its in-flight work is counted and a dispatch added.
* **sweeps and re-placement** - tasks are locked ``FOR UPDATE SKIP LOCKED``, so
  replicas sweeping at once each take different rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Interval,
    RowMapping,
    String,
    and_,
    exists,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from common import audit as audit_log
from common.db.schema import (
    collector_capabilities,
    collector_updates,
    collectors,
    device_leases,
    dispatches,
    releases,
    sites,
    task_transitions,
    tasks,
    vault_integrations,
)
from common.envelope.fence import FENCE_S
from router.states import IN_FLIGHT, State

_IN_FLIGHT = [s.value for s in IN_FLIGHT]
# Connection.info key: ids of tasks this transaction moved (published on commit).
CHANGED_TASKS = "versus_changed_tasks"


@dataclass(frozen=True, slots=True)
class LeaseHeld:
    """Why a device could not be leased: another task holds it, or an earlier writer's fence runs."""

    holder_task_id: str
    fenced_until: dt.datetime | None = None


async def transition(
    conn: AsyncConnection,
    task_id: str,
    from_state: State,
    to_state: State,
    reason: str = "",
    dispatch_id: str | None = None,
    **values: Any,
) -> None:
    """Move a locked task to ``to_state`` (the caller has checked legality) and record it.

    The task id is noted on the connection; once the transaction commits, watchers of the
    task are woken (router/live.py ``TaskWakes``).
    """
    await transitions(conn, task_id, [(from_state, to_state, reason)], dispatch_id, **values)


async def transitions(
    conn: AsyncConnection,
    task_id: str,
    steps: Sequence[tuple[State, State, str]],
    dispatch_id: str | None = None,
    **values: Any,
) -> None:
    """Move a locked task through ``steps`` (from, to, reason), recording each, in one statement.

    The task row update and the history rows go together (``WITH moved AS (UPDATE ...) INSERT``):
    one round trip instead of two per step, on the path every task takes several times.
    """
    conn.info.setdefault(CHANGED_TASKS, set()).add(task_id)
    moved = (
        update(tasks)
        .where(tasks.c.task_id == task_id)
        .values(state=steps[-1][1].value, updated_at=func.now(), **values)
        .returning(tasks.c.task_id)
        .cte("moved")
    )
    rows = [
        select(
            moved.c.task_id,
            literal(dispatch_id, String),
            literal(from_state.value, String),
            literal(to_state.value, String),
            literal(reason, String),
        )
        for from_state, to_state, reason in steps
    ]
    history_rows = rows[0] if len(rows) == 1 else union_all(*rows)
    await conn.execute(
        insert(task_transitions).from_select(
            ["task_id", "dispatch_id", "from_state", "to_state", "reason"], history_rows
        )
    )


async def insert_task(
    conn: AsyncConnection, values: Mapping[str, Any], reason: str = "submitted"
) -> RowMapping | None:
    """Insert a new task and its first history row (``reason``) in one statement; None when the
    tenant already has a task under this idempotency key (then nothing is written)."""
    created = (
        pg_insert(tasks)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["tenant_id", "idempotency_key"])
        .returning(*tasks.c)
        .cte("created")
    )
    state = literal(values["state"], String)
    history = (
        insert(task_transitions)
        .from_select(
            ["task_id", "dispatch_id", "from_state", "to_state", "reason"],
            select(created.c.task_id, literal(None, String), state, state, literal(reason, String)),
        )
        .cte("history")
    )
    row = (await conn.execute(select(*created.c).add_cte(history))).mappings().first()
    if row is not None:
        conn.info.setdefault(CHANGED_TASKS, set()).add(row["task_id"])
    return row


async def task_by_key(conn: AsyncConnection, tenant_id: str, idempotency_key: str) -> RowMapping | None:
    return (
        (
            await conn.execute(
                select(*tasks.c).where(
                    tasks.c.tenant_id == tenant_id, tasks.c.idempotency_key == idempotency_key
                )
            )
        )
        .mappings()
        .first()
    )


async def get_task(
    conn: AsyncConnection, task_id: str, *, lock: bool = False, skip_locked: bool = False
) -> RowMapping | None:
    query = select(*tasks.c).where(tasks.c.task_id == task_id)
    if lock:
        query = query.with_for_update(skip_locked=skip_locked)
    return (await conn.execute(query)).mappings().first()


async def task_of_dispatch(
    conn: AsyncConnection, dispatch_id: str, *, lock: bool = False
) -> RowMapping | None:
    """The task a dispatch belongs to (locked: only the task row), in one statement; None when
    there is no such dispatch."""
    owner = select(dispatches.c.task_id).where(dispatches.c.dispatch_id == dispatch_id).scalar_subquery()
    query = select(*tasks.c).where(tasks.c.task_id == owner)
    if lock:
        query = query.with_for_update(of=tasks)
    return (await conn.execute(query)).mappings().first()


async def lock_if_queued(conn: AsyncConnection, task_id: str) -> RowMapping | None:
    """The task, locked, if it is still queued and no one else holds it; else None.

    Only a queued row is locked: locking a task that was leased meanwhile, however briefly,
    would make its collector's claim skip it (SKIP LOCKED) and wait for a wake-up that
    already went out.
    """
    query = (
        select(*tasks.c)
        .where(tasks.c.task_id == task_id, tasks.c.state == State.QUEUED.value)
        .with_for_update(skip_locked=True)
    )
    return (await conn.execute(query)).mappings().first()


async def history(conn: AsyncConnection, task_id: str) -> Sequence[RowMapping]:
    query = (
        select(*task_transitions.c)
        .where(task_transitions.c.task_id == task_id)
        .order_by(task_transitions.c.id)
    )
    return (await conn.execute(query)).mappings().all()


async def candidates(conn: AsyncConnection, site_id: str, tenant_id: str) -> Sequence[RowMapping]:
    """Active, unexpired collectors of the site and tenant that published a manifest (its version only)."""
    query = (
        select(
            collectors.c.collector_id,
            collectors.c.site_id,
            collectors.c.tenant_id,
            collectors.c.status,
            collector_capabilities.c.epoch,
            collector_capabilities.c.updated_at,
            collector_capabilities.c.fips,
            collector_capabilities.c.draining,
            collectors.c.dispatch_kids,
        )
        .join(collector_capabilities, collector_capabilities.c.collector_id == collectors.c.collector_id)
        .where(
            collectors.c.site_id == site_id,
            collectors.c.tenant_id == tenant_id,
            collectors.c.status == "active",
            collectors.c.cert_not_after > func.now(),
        )
    )
    return (await conn.execute(query)).mappings().all()


async def manifests(conn: AsyncConnection, collector_ids: Sequence[str]) -> Sequence[Any]:
    """(collector id, manifest, epoch, updated_at) of these collectors."""
    query = select(
        collector_capabilities.c.collector_id,
        collector_capabilities.c.manifest,
        collector_capabilities.c.epoch,
        collector_capabilities.c.updated_at,
    ).where(collector_capabilities.c.collector_id.in_(list(collector_ids)))
    return (await conn.execute(query)).all()


async def lock_collector(conn: AsyncConnection, collector_id: str, *, skip_locked: bool) -> bool:
    """Lock one collector's capabilities row (its capacity) if it may take work now.

    False when the collector is no longer active, its certificate ended, an operator drains
    it, or (with ``skip_locked``) another placement holds the lock. This is the authoritative
    check: the candidate list placement starts from may be up to a second old.

    A placement waits only for the first collector it tries and skips locked ones after that,
    so two placements never wait on each other while holding a collector lock: no deadlock.
    """
    result = await conn.execute(
        select(collector_capabilities.c.collector_id)
        .join(collectors, collectors.c.collector_id == collector_capabilities.c.collector_id)
        .where(
            collector_capabilities.c.collector_id == collector_id,
            collectors.c.status == "active",
            collectors.c.cert_not_after > func.now(),
            collector_capabilities.c.draining.is_(False),
        )
        .with_for_update(of=collector_capabilities, skip_locked=skip_locked)
    )
    return result.first() is not None


async def in_flight(conn: AsyncConnection, collector_id: str, provider: str) -> int:
    result = await conn.execute(
        select(func.count())
        .select_from(dispatches)
        .where(
            dispatches.c.collector_id == collector_id,
            dispatches.c.provider == provider,
            dispatches.c.state.in_(_IN_FLIGHT),
        )
    )
    return int(result.scalar_one())


async def all_in_flight(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    result = await conn.execute(
        select(dispatches.c.collector_id, dispatches.c.provider, func.count())
        .where(dispatches.c.state.in_(_IN_FLIGHT))
        .group_by(dispatches.c.collector_id, dispatches.c.provider)
    )
    return {(row[0], row[1]): int(row[2]) for row in result}


async def acquire_lease(
    conn: AsyncConnection, target_ref: str, task_id: str, collector_id: str | None, expires_at: dt.datetime
) -> int | LeaseHeld:
    """The new epoch, or why the device is not available. Re-acquiring by the same task keeps working.

    A device is available when nobody holds it (or the holder's lease ran out) and no earlier
    writer's fence is running (``fenced_until``, set on release: see :func:`release_lease`).
    ``expires_at`` must itself cover the fence of the holder's last envelope.
    """
    stmt = (
        pg_insert(device_leases)
        .values(
            target_ref=target_ref, epoch=1, holder_task_id=task_id, collector_id=collector_id,
            acquired_at=func.now(), expires_at=expires_at,
        )
        .on_conflict_do_update(
            index_elements=["target_ref"],
            set_={
                "epoch": device_leases.c.epoch + 1,
                "holder_task_id": task_id,
                "holder_dispatch_id": None,
                "collector_id": collector_id,
                "acquired_at": func.now(),
                "expires_at": expires_at,
            },
            where=and_(
                or_(
                    device_leases.c.holder_task_id.is_(None),
                    device_leases.c.holder_task_id == task_id,
                    device_leases.c.expires_at < func.now(),
                ),
                or_(device_leases.c.fenced_until.is_(None), device_leases.c.fenced_until <= func.now()),
            ),
        )
        .returning(device_leases.c.epoch)
    )  # fmt: skip
    epoch = (await conn.execute(stmt)).scalar_one_or_none()
    if epoch is not None:
        return int(epoch)
    holder = await conn.execute(
        select(device_leases.c.holder_task_id, device_leases.c.fenced_until).where(
            device_leases.c.target_ref == target_ref
        )
    )
    holder_task_id, fenced_until = holder.one()
    return LeaseHeld(holder_task_id or "", fenced_until)


async def set_lease_dispatch(conn: AsyncConnection, target_ref: str, task_id: str, dispatch_id: str) -> None:
    await conn.execute(
        update(device_leases)
        .where(device_leases.c.target_ref == target_ref, device_leases.c.holder_task_id == task_id)
        .values(holder_dispatch_id=dispatch_id)
    )


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


async def release_lease(conn: AsyncConnection, target_ref: str, task_id: str) -> None:
    """Release the device if this task holds it; the row (and its epoch) stays.

    The row keeps a fence: no other writer gets the device before every envelope this
    task had handed out and not heard back from is past ``expires_at`` + FENCE_S.
    """
    await conn.execute(
        update(device_leases)
        .where(device_leases.c.target_ref == target_ref, device_leases.c.holder_task_id == task_id)
        .values(**_RELEASED, fenced_until=func.greatest(device_leases.c.fenced_until, _fence_of(task_id)))
    )


async def lease_holder(conn: AsyncConnection, target_ref: str) -> RowMapping | None:
    query = select(*device_leases.c).where(device_leases.c.target_ref == target_ref)
    return (await conn.execute(query)).mappings().first()


async def insert_dispatch(conn: AsyncConnection, values: Mapping[str, Any]) -> None:
    await conn.execute(insert(dispatches).values(**values))


async def collector_dispatch_kids(conn: AsyncConnection, collector_id: str) -> list[str] | None:
    """The dispatch kids the collector holds (None: enrolled before they were recorded)."""
    query = select(collectors.c.dispatch_kids).where(collectors.c.collector_id == collector_id)
    kids = (await conn.execute(query)).scalar_one_or_none()
    return None if kids is None else list(kids)


async def set_dispatch_kids(conn: AsyncConnection, collector_id: str, kids: Sequence[str]) -> bool:
    """Record the dispatch kids a collector holds; True when that changed anything."""
    result = await conn.execute(
        update(collectors)
        .where(collectors.c.collector_id == collector_id)
        .where(collectors.c.dispatch_kids.is_distinct_from(list(kids)))
        .values(dispatch_kids=list(kids))
    )
    return bool(result.rowcount)


async def collector_public_key(conn: AsyncConnection, collector_id: str) -> bytes | None:
    """The DER public key on record for ``collector_id`` (it verifies the collector's reports)."""
    query = select(collectors.c.public_key_der).where(collectors.c.collector_id == collector_id)
    found = (await conn.execute(query)).scalar_one_or_none()
    return None if found is None else bytes(found)


async def get_dispatch(conn: AsyncConnection, dispatch_id: str, *, lock: bool = False) -> RowMapping | None:
    query = select(*dispatches.c).where(dispatches.c.dispatch_id == dispatch_id)
    if lock:
        query = query.with_for_update()
    return (await conn.execute(query)).mappings().first()


async def update_dispatch(conn: AsyncConnection, dispatch_id: str, **values: Any) -> None:
    await conn.execute(
        update(dispatches)
        .where(dispatches.c.dispatch_id == dispatch_id)
        .values(updated_at=func.now(), **values)
    )


# One statement, one round trip, atomic on its own (it runs outside an explicit transaction):
# lock the oldest unexpired leased dispatches of the collector (up to :limit) together with
# their tasks (SKIP LOCKED on both, so concurrent claims and a concurrent cancel never wait on
# each other), mark them handed out in this numbered claim, move execute tasks leased ->
# dispatched and record it.
_TAKE = text(
    """
WITH picked AS (
    SELECT d.dispatch_id, d.task_id, d.kind
    FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
    WHERE d.collector_id = :collector_id AND d.state = 'leased' AND d.expires_at > now()
      AND (CAST(:providers AS text[]) IS NULL OR d.provider = ANY(CAST(:providers AS text[])))
    ORDER BY d.created_at
    LIMIT :limit
    FOR UPDATE OF d, t SKIP LOCKED
), handed AS (
    UPDATE dispatches d
    SET state = 'dispatched', handed_claim_seq = :claim_seq, handed_at = now(), updated_at = now()
    FROM picked WHERE d.dispatch_id = picked.dispatch_id
    RETURNING d.dispatch_id, d.task_id, d.kind, d.envelope, d.created_at
), moved AS (
    UPDATE tasks t SET state = 'dispatched', updated_at = now()
    FROM handed WHERE t.task_id = handed.task_id AND handed.kind = 'execute'
    RETURNING t.task_id, handed.dispatch_id
), recorded AS (
    INSERT INTO task_transitions (task_id, dispatch_id, from_state, to_state, reason)
    SELECT task_id, dispatch_id, 'leased', 'dispatched', 'claimed' FROM moved
)
SELECT dispatch_id, task_id, kind, envelope, created_at FROM handed ORDER BY created_at
"""
)


async def take_leased(
    conn: AsyncConnection,
    collector_id: str,
    claim_seq: int,
    limit: int = 1,
    providers: Sequence[str] | None = None,
) -> Sequence[RowMapping]:
    """Hand out up to ``limit`` of the collector's oldest unexpired leased dispatches (``_TAKE``),
    only of ``providers`` when given (those the collector has a free slot for)."""
    params = {
        "collector_id": collector_id, "claim_seq": claim_seq, "limit": limit,
        "providers": None if providers is None else list(providers),
    }  # fmt: skip
    rows = (await conn.execute(_TAKE, params)).mappings().all()
    for row in rows:
        if row["kind"] == "execute":
            conn.info.setdefault(CHANGED_TASKS, set()).add(row["task_id"])
    return rows


async def leased_to(conn: AsyncConnection, collector_id: str) -> Sequence[RowMapping]:
    """Dispatches leased to the collector and not handed out yet, locked."""
    query = (
        select(*dispatches.c)
        .where(dispatches.c.collector_id == collector_id, dispatches.c.state == State.LEASED.value)
        .with_for_update()
    )
    return (await conn.execute(query)).mappings().all()


def _handed_out(collector_id: str, before_claim_seq: int) -> tuple[Any, ...]:
    return (
        dispatches.c.collector_id == collector_id,
        dispatches.c.state == State.DISPATCHED.value,
        dispatches.c.reported_at.is_(None),
        dispatches.c.handed_claim_seq > 0,
        dispatches.c.handed_claim_seq < before_claim_seq,
    )


async def handed_out(conn: AsyncConnection, collector_id: str, before_claim_seq: int) -> Sequence[RowMapping]:
    """Dispatched, unreported dispatches handed out in an earlier numbered claim, locked (skip locked)."""
    query = (
        select(*dispatches.c)
        .where(*_handed_out(collector_id, before_claim_seq))
        .with_for_update(skip_locked=True)
    )
    return (await conn.execute(query)).mappings().all()


async def next_queued(
    conn: AsyncConnection, site_id: str, tenant_id: str, provider: str
) -> RowMapping | None:
    """The oldest queued task a freed slot of this site, tenant and provider could take, locked."""
    query = (
        select(*tasks.c)
        .where(
            tasks.c.state == State.QUEUED.value,
            tasks.c.site_id == site_id,
            tasks.c.tenant_id == tenant_id,
            tasks.c.provider == provider,
        )
        .order_by(tasks.c.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    return (await conn.execute(query)).mappings().first()


async def queued_task_ids(conn: AsyncConnection, limit: int, site_id: str | None = None) -> Sequence[str]:
    """Ids of queued tasks, oldest first (the caller locks each one as it places it)."""
    query = select(tasks.c.task_id).where(tasks.c.state == State.QUEUED.value)
    if site_id is not None:
        query = query.where(tasks.c.site_id == site_id)
    query = query.order_by(tasks.c.created_at).limit(limit)
    return list((await conn.execute(query)).scalars())


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


async def overdue_queued(conn: AsyncConnection, limit: int) -> Sequence[str]:
    query = (
        select(tasks.c.task_id)
        .where(tasks.c.state == State.QUEUED.value, tasks.c.deadline <= func.now())
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list((await conn.execute(query)).scalars())


async def orphan_leases(conn: AsyncConnection) -> int:
    """Release leases whose holder task is no longer in flight or whose time ran out."""
    live_holders = select(tasks.c.task_id).where(
        tasks.c.state.in_(
            [
                *_IN_FLIGHT,
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


async def unknown_due(conn: AsyncConnection, limit: int) -> Sequence[RowMapping]:
    """Unknown outcomes whose fence (or deadline) has passed: their ladder step runs now, locked."""
    query = (
        select(*tasks.c)
        .where(
            tasks.c.state == State.UNKNOWN.value,
            or_(tasks.c.retry_at <= func.now(), tasks.c.deadline <= func.now()),
        )
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (await conn.execute(query)).mappings().all()


async def refused_by(conn: AsyncConnection, task_id: str) -> set[str]:
    """Collectors that refused an envelope of this task as not valid for them (never again)."""
    query = select(dispatches.c.collector_id).where(
        dispatches.c.task_id == task_id, dispatches.c.error_code.like("envelope_refused:%")
    )
    return set((await conn.execute(query)).scalars())


async def reconcile_count(conn: AsyncConnection, task_id: str) -> int:
    """Reconcile-reads sent for this task, not counting ones provably never received."""
    query = (
        select(func.count())
        .select_from(dispatches)
        .where(
            dispatches.c.task_id == task_id,
            dispatches.c.kind == "reconcile",
            dispatches.c.state != State.EXPIRED.value,
        )
    )
    return int((await conn.execute(query)).scalar_one())


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
) -> Sequence[RowMapping]:
    """The dispatch queue, newest first, each row with its task's state as ``task_state``."""
    query = select(*dispatches.c, tasks.c.state.label("task_state")).join(
        tasks, tasks.c.task_id == dispatches.c.task_id
    )
    if dispatch_id:
        query = query.where(dispatches.c.dispatch_id == dispatch_id)
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


async def upsert_capabilities(
    conn: AsyncConnection,
    collector_id: str,
    epoch: int,
    manifest: Mapping[str, Any],
    fips: bool,
    version: str,
) -> int:
    """Store the manifest unless a newer epoch is already recorded; returns the recorded epoch."""
    values = {"epoch": epoch, "manifest": dict(manifest), "fips": fips, "agent_version": version}
    stmt = (
        pg_insert(collector_capabilities)
        .values(collector_id=collector_id, **values)
        .on_conflict_do_update(
            index_elements=["collector_id"],
            set_={**values, "updated_at": func.now()},
            where=collector_capabilities.c.epoch <= epoch,
        )
        .returning(collector_capabilities.c.epoch)
    )  # fmt: skip
    stored = (await conn.execute(stmt)).scalar_one_or_none()
    if stored is not None:
        return int(stored)
    current = await conn.execute(
        select(collector_capabilities.c.epoch).where(collector_capabilities.c.collector_id == collector_id)
    )
    return int(current.scalar_one())


async def collector_standing(
    conn: AsyncConnection, collector_id: str, before_claim_seq: int = 0
) -> RowMapping | None:
    """Status, certificate end, config version, dispatch kids and recorded vault settings of one
    collector (checked on every claim), and ``handed_out``: whether a dispatch handed out in a claim
    before ``before_claim_seq`` is still unreported (an unlocked read: almost always false; when true
    the claim looks closer with :func:`handed_out`)."""
    unanswered = (
        exists(select(dispatches.c.dispatch_id).where(*_handed_out(collector_id, before_claim_seq)))
        if before_claim_seq > 0
        else literal(False)
    )
    query = (
        select(
            collectors.c.status,
            collectors.c.cert_not_after,
            collectors.c.config_version,
            collectors.c.dispatch_kids,
            collectors.c.vault_mode,
            collectors.c.vault_integration_id,
            vault_integrations.c.address,
            vault_integrations.c.role_id,
            vault_integrations.c.kv_mount,
            # The upgrade target the signed config names (router/updates.py).
            releases.c.version.label("target_version"),
            releases.c.target_name,
            releases.c.sha256.label("target_sha256"),
            releases.c.length.label("target_length"),
            unanswered.label("handed_out"),
        )
        .outerjoin(
            vault_integrations, vault_integrations.c.integration_id == collectors.c.vault_integration_id
        )
        .outerjoin(collector_updates, collector_updates.c.collector_id == collectors.c.collector_id)
        .outerjoin(
            releases,
            and_(
                releases.c.version == collector_updates.c.target_version,
                releases.c.os == collectors.c.os,
                releases.c.arch == collectors.c.arch,
                releases.c.yanked_at.is_(None),
            ),
        )
        .where(collectors.c.collector_id == collector_id)
    )
    return (await conn.execute(query)).mappings().first()


async def collector_home(conn: AsyncConnection, collector_id: str) -> RowMapping | None:
    """Site and tenant of one collector (None: no such collector)."""
    query = select(collectors.c.site_id, collectors.c.tenant_id).where(
        collectors.c.collector_id == collector_id
    )
    return (await conn.execute(query)).mappings().first()


async def site_tenant(conn: AsyncConnection, site_id: str) -> str | None:
    """The tenant a site belongs to (None: no such site)."""
    return (
        await conn.execute(select(sites.c.tenant_id).where(sites.c.site_id == site_id))
    ).scalar_one_or_none()


async def collector_site(conn: AsyncConnection, collector_id: str) -> str | None:
    result = await conn.execute(select(collectors.c.site_id).where(collectors.c.collector_id == collector_id))
    return result.scalar_one_or_none()


async def audit(
    conn: AsyncConnection, actor: str, action: str, task_id: str, details: Mapping[str, Any]
) -> None:
    await audit_log.record(
        conn, service="router", actor=actor, action=action, subject_type="task", subject_id=task_id,
        details=details,
    )  # fmt: skip


async def soonest_cert_expiry(conn: AsyncConnection) -> dt.datetime | None:
    """The earliest certificate expiry among active collectors."""
    result = await conn.execute(
        select(func.min(collectors.c.cert_not_after)).where(collectors.c.status == "active")
    )
    value: dt.datetime | None = result.scalar_one()
    return value


async def queued_count(conn: AsyncConnection) -> int:
    result = await conn.execute(
        select(func.count()).select_from(tasks).where(tasks.c.state == State.QUEUED.value)
    )
    return int(result.scalar_one())
