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

from psycopg.types.json import Jsonb
from sqlalchemy import (
    Interval,
    RowMapping,
    and_,
    func,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from common import audit as audit_log
from common.db.schema import (
    collector_capabilities,
    collectors,
    device_leases,
    dispatches,
    sites,
    task_transitions,
    tasks,
)
from common.envelope.fence import FENCE_S
from router.sql import Db, sql
from router.states import IN_FLIGHT, State

_IN_FLIGHT = [s.value for s in IN_FLIGHT]
# Connection.info key: ids of tasks this transaction moved (published on commit).
CHANGED_TASKS = "versus_changed_tasks"


@dataclass(frozen=True, slots=True)
class LeaseHeld:
    """Why a device could not be leased: another task holds it, or an earlier writer's fence runs."""

    holder_task_id: str
    fenced_until: dt.datetime | None = None


_TASK_COLUMNS = frozenset(tasks.c.keys())


async def transition(
    conn: Db,
    task_id: str,
    from_state: State,
    to_state: State,
    reason: str = "",
    dispatch_id: str | None = None,
    **values: Any,
) -> dict[str, Any] | None:
    """Move a locked task to ``to_state`` (the caller has checked legality) and record it; the
    task row as it is now.

    The task id is noted on the connection; once the transaction commits, watchers of the
    task are woken (router/live.py ``TaskWakes``).
    """
    return await transitions(conn, task_id, [(from_state, to_state, reason)], dispatch_id, **values)


def _transitions_sql(
    columns: tuple[str, ...], steps: int, with_dispatch: bool, answering: bool, releasing: bool
) -> str:
    unknown = set(columns) - _TASK_COLUMNS
    if unknown:
        raise ValueError(f"not columns of tasks: {sorted(unknown)}")
    sets = "".join(f", {c} = %(v_{c})s" for c in columns)
    history = "\n    UNION ALL ".join(
        f"SELECT task_id, %(dispatch_id)s, %(f{i})s, %(t{i})s, %(r{i})s FROM moved" for i in range(steps)
    )
    before = (
        (_NEW_DISPATCH if with_dispatch else "")
        + (_ANSWERED if answering else "")
        + (_RELEASING if releasing else "")
    )
    return f"""
WITH {before}moved AS (
    UPDATE tasks SET state = %(state)s, updated_at = now(){sets}
    WHERE task_id = %(task_id)s RETURNING *
), recorded AS (
    INSERT INTO task_transitions (task_id, dispatch_id, from_state, to_state, reason)
    {history}
)
SELECT * FROM moved"""


# The collector's final answer on the dispatch (its slot is free again).
_ANSWERED = """answered AS (
    UPDATE dispatches
    SET updated_at = now(), state = %(a_state)s, reported_at = now(), result = %(a_result)s,
        error_code = %(a_error_code)s, error_message = %(a_error_message)s,
        report_signature = coalesce(%(a_report_signature)s, report_signature)
    WHERE dispatch_id = %(dispatch_id)s
), """


def _release_sql(target_param: str, *, skip_answered: bool) -> str:
    """Release ``%(task_id)s``'s lease of the device ``%(<target_param>)s``, keeping the fence of its
    unanswered envelopes: the plain-SQL twin of :func:`_fence_of`. With ``skip_answered`` the
    dispatch ``%(dispatch_id)s``, answered in the same statement (which does not see its own
    update), is left out of the fence by name."""
    skip = " AND d.dispatch_id <> %(dispatch_id)s" if skip_answered else ""
    return f"""
    UPDATE device_leases
    SET holder_task_id = NULL, holder_dispatch_id = NULL, collector_id = NULL, expires_at = NULL,
        fenced_until = greatest(fenced_until, (
            SELECT max(d.expires_at) + interval '{FENCE_S} seconds' FROM dispatches d
            WHERE d.task_id = %(task_id)s AND d.handed_at IS NOT NULL AND d.reported_at IS NULL
              AND d.state <> 'expired' AND d.op_class <> 'read'{skip}))
    WHERE target_ref = %({target_param})s AND holder_task_id = %(task_id)s"""


# The task's device released, as release_lease does. The dispatch answered in the same statement is
# left out of the fence by name: the statement does not see its own ``answered`` update.
_RELEASING = f"""released AS ({_release_sql("r_target_ref", skip_answered=True)}
), """


# A new dispatch of the task and, when it is the execution of a leased device's holder, the lease's
# note of it: written with the task's move to leased (one statement for what placement writes).
_NEW_DISPATCH = """created_dispatch AS (
    INSERT INTO dispatches (dispatch_id, task_id, kind, attempt, collector_id, site_id, target_ref, provider,
                            operation, op_class, state, lease_epoch, envelope, expires_at,
                            relayed_credential)
    VALUES (%(dispatch_id)s, %(task_id)s, %(d_kind)s, %(d_attempt)s, %(d_collector_id)s, %(d_site_id)s,
            %(d_target_ref)s, %(d_provider)s, %(d_operation)s, %(d_op_class)s, %(d_state)s,
            %(d_lease_epoch)s, %(d_envelope)s, %(d_expires_at)s, %(d_relayed_credential)s)
), noted_on_lease AS (
    UPDATE device_leases SET holder_dispatch_id = %(dispatch_id)s
    WHERE %(d_kind)s = 'execute' AND %(d_lease_epoch)s > 0
      AND target_ref = %(d_target_ref)s AND holder_task_id = %(task_id)s
), """


# One statement text per (columns set, number of steps, with a new dispatch): psycopg prepares
# each after a few uses.
_TRANSITIONS: dict[tuple[tuple[str, ...], int, bool, bool, bool], str] = {}

# The columns an answer writes on its dispatch (``answered`` of :func:`transitions`).
ANSWER_COLUMNS = ("state", "result", "error_code", "error_message", "report_signature")


async def transitions(
    conn: Db,
    task_id: str,
    steps: Sequence[tuple[State, State, str]],
    dispatch_id: str | None = None,
    *,
    new_dispatch: Mapping[str, Any] | None = None,
    answered: Mapping[str, Any] | None = None,
    release_lease_of: str | None = None,
    **values: Any,
) -> dict[str, Any] | None:
    """Move a locked task through ``steps`` (from, to, reason), recording each, in one statement;
    the task row as it is now (None: no such task).

    The task row update and the history rows go together (``WITH moved AS (UPDATE ...) INSERT``):
    one round trip instead of two per step, on the path every task takes several times. With
    ``new_dispatch`` (the row's values, its id ``dispatch_id``) the same statement inserts the
    dispatch and, for a leased device, notes it on the lease. With ``answered`` (values of
    :data:`ANSWER_COLUMNS`) it records the collector's final answer on dispatch ``dispatch_id``;
    with ``release_lease_of`` (a device) it releases the task's lease as :func:`release_lease`.
    """
    db = await sql(conn)
    db.info.setdefault(CHANGED_TASKS, set()).add(task_id)
    columns = tuple(sorted(values))
    key = (columns, len(steps), new_dispatch is not None, answered is not None, release_lease_of is not None)
    query = _TRANSITIONS.get(key)
    if query is None:
        query = _TRANSITIONS[key] = _transitions_sql(*key)
    params: dict[str, Any] = {"task_id": task_id, "state": steps[-1][1].value, "dispatch_id": dispatch_id}
    for i, (from_state, to_state, reason) in enumerate(steps):
        params[f"f{i}"], params[f"t{i}"], params[f"r{i}"] = from_state.value, to_state.value, reason
    for c in columns:
        params[f"v_{c}"] = Jsonb(values[c]) if c == "labels" else values[c]
    if new_dispatch is not None:
        assert new_dispatch["dispatch_id"] == dispatch_id and new_dispatch["task_id"] == task_id
        params.update({f"d_{k}": v for k, v in new_dispatch.items()})
    if answered is not None:
        assert set(answered) == set(ANSWER_COLUMNS)
        params.update({f"a_{k}": v for k, v in answered.items()})
    if release_lease_of is not None:
        params["r_target_ref"] = release_lease_of
    return await db.one(query, params)


_INSERT_TASK = """
WITH created AS (
    INSERT INTO tasks (task_id, idempotency_key, request_sha256, provider, operation, op_class,
                       target_ref, site_id, tenant_id, params, deadline, requires_fips, labels, features,
                       protocol_floor, state)
    VALUES (%(task_id)s, %(idempotency_key)s, %(request_sha256)s, %(provider)s, %(operation)s,
            %(op_class)s, %(target_ref)s, %(site_id)s, %(tenant_id)s, %(params)s, %(deadline)s,
            %(requires_fips)s, %(labels)s, %(features)s, %(protocol_floor)s, %(state)s)
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING *
), history AS (
    INSERT INTO task_transitions (task_id, dispatch_id, from_state, to_state, reason)
    SELECT task_id, NULL, state, state, %(reason)s FROM created
)
SELECT * FROM created"""


async def insert_task(
    conn: Db, values: Mapping[str, Any], reason: str = "submitted"
) -> dict[str, Any] | None:
    """Insert a new task and its first history row (``reason``) in one statement; None when the
    tenant already has a task under this idempotency key (then nothing is written)."""
    db = await sql(conn)
    row = await db.one(_INSERT_TASK, {**values, "labels": Jsonb(values["labels"]), "reason": reason})
    if row is not None:
        db.info.setdefault(CHANGED_TASKS, set()).add(row["task_id"])
    return row


async def task_by_key(conn: Db, tenant_id: str, idempotency_key: str) -> dict[str, Any] | None:
    return await (await sql(conn)).one(
        "SELECT * FROM tasks WHERE tenant_id = %(t)s AND idempotency_key = %(k)s",
        {"t": tenant_id, "k": idempotency_key},
    )


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


async def task_of_dispatch(conn: Db, dispatch_id: str, *, lock: bool = False) -> dict[str, Any] | None:
    """The task a dispatch belongs to (locked: only the task row), in one statement; None when
    there is no such dispatch."""
    query = (
        "SELECT * FROM tasks WHERE task_id = (SELECT task_id FROM dispatches WHERE dispatch_id = %(id)s)"
        + (" FOR UPDATE" if lock else "")
    )
    return await (await sql(conn)).one(query, {"id": dispatch_id})


async def lock_if_queued(conn: Db, task_id: str) -> dict[str, Any] | None:
    """The task, locked, if it is still queued and no one else holds it; else None.

    Only a queued row is locked: locking a task that was leased meanwhile, however briefly,
    would make its collector's claim skip it (SKIP LOCKED) and wait for a wake-up that
    already went out.
    """
    return await (await sql(conn)).one(
        "SELECT * FROM tasks WHERE task_id = %(id)s AND state = 'queued' FOR UPDATE SKIP LOCKED",
        {"id": task_id},
    )


async def history(conn: AsyncConnection, task_id: str) -> Sequence[RowMapping]:
    query = (
        select(*task_transitions.c)
        .where(task_transitions.c.task_id == task_id)
        .order_by(task_transitions.c.id)
    )
    return (await conn.execute(query)).mappings().all()


_CANDIDATES = """
SELECT c.collector_id, c.site_id, c.tenant_id, c.status, cc.epoch, cc.updated_at, cc.fips, cc.draining,
       c.dispatch_kids, c.vault_mode
FROM collectors c JOIN collector_capabilities cc ON cc.collector_id = c.collector_id
WHERE c.site_id = %(site)s AND c.tenant_id = %(tenant)s AND c.status = 'active'
  AND c.cert_not_after > now()"""


async def candidates(conn: Db, site_id: str, tenant_id: str) -> list[dict[str, Any]]:
    """Active, unexpired collectors of the site and tenant that published a manifest (its version only)."""
    return await (await sql(conn)).all(_CANDIDATES, {"site": site_id, "tenant": tenant_id})


async def manifests(conn: Db, collector_ids: Sequence[str]) -> list[dict[str, Any]]:
    """collector_id, manifest, epoch and updated_at of these collectors."""
    return await (await sql(conn)).all(
        "SELECT collector_id, manifest, epoch, updated_at FROM collector_capabilities"
        " WHERE collector_id = ANY(%(ids)s)",
        {"ids": list(collector_ids)},
    )


_LOCK_COLLECTOR = """
SELECT cc.collector_id
FROM collector_capabilities cc JOIN collectors c ON c.collector_id = cc.collector_id
WHERE cc.collector_id = %(id)s AND c.status = 'active' AND c.cert_not_after > now() AND NOT cc.draining
FOR UPDATE OF cc"""


async def lock_collector(conn: Db, collector_id: str, *, skip_locked: bool) -> bool:
    """Lock one collector's capabilities row (its capacity) if it may take work now.

    False when the collector is no longer active, its certificate ended, an operator drains
    it, or (with ``skip_locked``) another placement holds the lock. This is the authoritative
    check: the candidate list placement starts from may be up to a second old.

    A placement waits only for the first collector it tries and skips locked ones after that,
    so two placements never wait on each other while holding a collector lock: no deadlock.
    """
    query = _LOCK_COLLECTOR + (" SKIP LOCKED" if skip_locked else "")
    return await (await sql(conn)).one(query, {"id": collector_id}) is not None


_IN_FLIGHT_COUNT = """
SELECT count(*) FROM dispatches
WHERE collector_id = %(id)s AND provider = %(provider)s AND state IN ('leased', 'dispatched', 'running')"""


async def in_flight(conn: Db, collector_id: str, provider: str) -> int:
    """The collector's dispatches of ``provider`` in flight.

    A statement of its own, after :func:`lock_collector`: a statement's snapshot is taken when it
    starts, so a count in the locking statement would miss work committed by the placement it
    waited for (tests/integration/test_router_concurrency.py).
    """
    return int(await (await sql(conn)).scalar(_IN_FLIGHT_COUNT, {"id": collector_id, "provider": provider}))


async def all_in_flight(conn: AsyncConnection) -> dict[tuple[str, str], int]:
    result = await conn.execute(
        select(dispatches.c.collector_id, dispatches.c.provider, func.count())
        .where(dispatches.c.state.in_(_IN_FLIGHT))
        .group_by(dispatches.c.collector_id, dispatches.c.provider)
    )
    return {(row[0], row[1]): int(row[2]) for row in result}


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


_RELEASE_LEASE = _release_sql("target", skip_answered=False)


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


async def collector_public_key(conn: Db, collector_id: str) -> bytes | None:
    """The DER public key on record for ``collector_id`` (it verifies the collector's reports)."""
    found = await (await sql(conn)).scalar(
        "SELECT public_key_der FROM collectors WHERE collector_id = %(id)s", {"id": collector_id}
    )
    return None if found is None else bytes(found)


async def get_dispatch(conn: Db, dispatch_id: str, *, lock: bool = False) -> dict[str, Any] | None:
    query = "SELECT * FROM dispatches WHERE dispatch_id = %(id)s" + (" FOR UPDATE" if lock else "")
    return await (await sql(conn)).one(query, {"id": dispatch_id})


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
    RETURNING d.dispatch_id, d.task_id, d.kind, d.envelope, d.created_at, d.relayed_credential
), moved AS (
    UPDATE tasks t SET state = 'dispatched', updated_at = now()
    FROM handed WHERE t.task_id = handed.task_id AND handed.kind = 'execute'
    RETURNING t.task_id, handed.dispatch_id
), recorded AS (
    INSERT INTO task_transitions (task_id, dispatch_id, from_state, to_state, reason)
    SELECT task_id, dispatch_id, 'leased', 'dispatched', 'claimed' FROM moved
)
SELECT dispatch_id, task_id, kind, envelope, created_at, relayed_credential FROM handed ORDER BY created_at
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
_HANDED_OUT = """d.collector_id = %(collector)s AND d.state = 'dispatched' AND d.reported_at IS NULL
    AND d.handed_claim_seq > 0 AND d.handed_claim_seq < %(before)s"""


async def handed_out(conn: Db, collector_id: str, before_claim_seq: int) -> list[dict[str, Any]]:
    """Dispatched, unreported dispatches handed out in an earlier numbered claim, locked (skip locked)."""
    return await (await sql(conn)).all(
        f"SELECT * FROM dispatches d WHERE {_HANDED_OUT} FOR UPDATE SKIP LOCKED",
        {"collector": collector_id, "before": before_claim_seq},
    )


_HELD = """
SELECT d.dispatch_id, d.kind, d.state, d.reported_at, t.state AS task_state, t.current_dispatch_id,
       t.cancel_requested_at
FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
WHERE d.collector_id = %(collector)s AND d.dispatch_id = ANY(%(held)s)"""


async def held_dispatches(conn: Db, collector_id: str, held: list[str]) -> list[dict[str, Any]]:
    """The collector's dispatches among ``held`` with their tasks' state and cancel request
    (router/cancels.py ``verdict``); unlocked: a verdict is advice read at one instant."""
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


_NEXT_QUEUED = """
SELECT * FROM tasks
WHERE state = 'queued' AND site_id = %(site)s AND tenant_id = %(tenant)s AND provider = %(provider)s
ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"""


async def next_queued(conn: Db, site_id: str, tenant_id: str, provider: str) -> dict[str, Any] | None:
    """The oldest queued task a freed slot of this site, tenant and provider could take, locked."""
    return await (await sql(conn)).one(
        _NEXT_QUEUED, {"site": site_id, "tenant": tenant_id, "provider": provider}
    )


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


async def refused_by(conn: Db, task_id: str) -> set[str]:
    """Collectors that refused an envelope of this task as not valid for them (never again)."""
    rows = await (await sql(conn)).all(
        "SELECT collector_id FROM dispatches"
        " WHERE task_id = %(id)s AND error_code LIKE 'envelope_refused:%%'",
        {"id": task_id},
    )
    return {r["collector_id"] for r in rows}


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


_STANDING = f"""
SELECT c.status, c.cert_not_after, c.config_version, c.dispatch_kids, c.vault_mode, c.vault_integration_id,
       c.vault_secret, c.vault_secret_version,
       v.address, v.role_id, v.kv_mount, v.path_prefix, v.ca_pem, v.secret_id_delivery,
       r.version AS target_version, r.target_name, r.sha256 AS target_sha256, r.length AS target_length,
       (%(before)s > 0 AND EXISTS (SELECT 1 FROM dispatches d WHERE {_HANDED_OUT})) AS handed_out
FROM collectors c
LEFT JOIN vault_integrations v ON v.integration_id = c.vault_integration_id
LEFT JOIN collector_updates u ON u.collector_id = c.collector_id
LEFT JOIN releases r
    ON r.version = u.target_version AND r.os = c.os AND r.arch = c.arch AND r.yanked_at IS NULL
WHERE c.collector_id = %(collector)s"""


async def collector_standing(conn: Db, collector_id: str, before_claim_seq: int = 0) -> dict[str, Any] | None:
    """Status, certificate end, config version, dispatch kids and recorded vault settings of one
    collector (checked on every claim), and ``handed_out``: whether a dispatch handed out in a claim
    before ``before_claim_seq`` is still unreported (an unlocked read: almost always false; when true
    the claim looks closer with :func:`handed_out`). The upgrade target the signed config names
    comes with it (router/updates.py)."""
    return await (await sql(conn)).one(_STANDING, {"collector": collector_id, "before": before_claim_seq})


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
