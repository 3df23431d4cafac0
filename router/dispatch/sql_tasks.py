"""The SQL of tasks and their transitions: submit, state moves with their lease releases, the queue.

Hot paths and why they are safe with several router replicas:

* **transitions** - one statement moves a batch of tasks, records their history and releases
  their device leases (router/dispatch/sql_leases.py keeps each lease's fence).
* **sweeps and re-placement** - tasks are locked ``FOR UPDATE SKIP LOCKED``, so
  replicas sweeping at once each take different rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import (
    RowMapping,
    func,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import (
    dispatches,
    task_transitions,
    tasks,
)
from router.core.sql import Db, sql
from router.core.states import TERMINAL, State
from router.core.store import CHANGED_TASKS, TASK_OUTCOMES
from router.dispatch.sql_leases import release_sql, release_sql_of

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
    task are woken (router/core/wakes.py ``TaskWakes``).
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


# The task's device released, as release_lease does. The dispatch answered in the same statement is
# left out of the fence by name: the statement does not see its own ``answered`` update.
_RELEASING = f"""released AS ({release_sql("r_target_ref", skip_answered=True)}
), """


# A new dispatch of the task and, when it is the execution of a leased device's holder, the lease's
# note of it: written with the task's move to leased (one statement for what placement writes).
_NEW_DISPATCH = """created_dispatch AS (
    INSERT INTO dispatches (dispatch_id, task_id, kind, attempt, collector_id, site_id, target_ref, provider,
                            operation, op_class, state, lease_epoch, envelope, expires_at,
                            relayed_credential, traceparent)
    VALUES (%(dispatch_id)s, %(task_id)s, %(d_kind)s, %(d_attempt)s, %(d_collector_id)s, %(d_site_id)s,
            %(d_target_ref)s, %(d_provider)s, %(d_operation)s, %(d_op_class)s, %(d_state)s,
            %(d_lease_epoch)s, %(d_envelope)s, %(d_expires_at)s, %(d_relayed_credential)s,
            %(d_traceparent)s)
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
    row = await db.one(query, params)
    _note_outcome(db.info, row, steps[-1][0], steps[-1][1])
    return row


# The states a task's outcome is counted in (versus_router_task_outcomes_total): where it ends,
# and where it waits for an operator.
OUTCOME_STATES = frozenset({*TERMINAL, State.INDETERMINATE})


def _note_outcome(info: dict[str, Any], row: Mapping[str, Any] | None, before: State, after: State) -> None:
    if row is not None and after in OUTCOME_STATES and before != after:
        info.setdefault(TASK_OUTCOMES, []).append((row["op_class"], after.value))


# A collector's final answer on its execution dispatch, in one statement outside any transaction:
# the task and dispatch locked (task first, as everywhere) only if the dispatch is this collector's,
# in flight, and its task waits for it; then the answer, the device's release, the task's move and
# its history, as :func:`transitions` writes them for this case. No row: the report needs the
# general path (router/dispatch/reports.py), and nothing was written. ``queued_behind``: a queued
# task of the same site, tenant and provider could use the freed slot.
_ANSWER_AT_ONCE = f"""
WITH ok AS (
    SELECT t.task_id, t.target_ref, t.state AS from_state
    FROM tasks t JOIN dispatches d ON d.task_id = t.task_id
    WHERE d.dispatch_id = %(dispatch_id)s AND d.collector_id = %(collector_id)s AND d.kind = 'execute'
      AND d.state IN ('dispatched', 'running') AND t.state IN ('dispatched', 'running')
    FOR UPDATE OF t, d
), answered AS (
    UPDATE dispatches
    SET updated_at = now(), state = %(a_state)s, reported_at = now(), result = %(a_result)s,
        error_code = %(a_error_code)s, error_message = %(a_error_message)s,
        report_signature = coalesce(%(a_report_signature)s, report_signature)
    WHERE dispatch_id = %(dispatch_id)s AND EXISTS (SELECT 1 FROM ok)
), released AS ({release_sql_of("ok.target_ref", "ok.task_id", skip_answered=True, source=" FROM ok")}
), moved AS (
    UPDATE tasks
    SET state = %(state)s, updated_at = now(), result = %(v_result)s, error_code = %(v_error_code)s
    FROM ok WHERE tasks.task_id = ok.task_id
    RETURNING tasks.*, ok.from_state
), recorded AS (
    INSERT INTO task_transitions (task_id, dispatch_id, from_state, to_state, reason)
    SELECT task_id, %(dispatch_id)s, from_state, %(state)s, %(reason)s FROM moved
)
SELECT moved.*, EXISTS (
    SELECT 1 FROM tasks q
    WHERE q.state = 'queued' AND q.site_id = moved.site_id AND q.tenant_id = moved.tenant_id
      AND q.provider = moved.provider
) AS queued_behind
FROM moved"""

# The outcomes and the states the statement above moves between (a unit test checks them against
# router/core/states.py).
ANSWER_AT_ONCE_OUTCOMES = (State.SUCCESS, State.FAILED)
ANSWER_AT_ONCE_FROM = (State.DISPATCHED, State.RUNNING)


async def answer_at_once(
    conn: Db,
    dispatch_id: str,
    collector_id: str,
    answered: Mapping[str, Any],
    *,
    result: bytes,
    error_code: str | None,
    reason: str,
) -> dict[str, Any] | None:
    """Record ``collector_id``'s final answer (:data:`ANSWER_AT_ONCE_OUTCOMES`, ``answered``: values
    of :data:`ANSWER_COLUMNS`) on its in-flight execution dispatch and finish the task, in one
    statement; the task row as it is now with ``from_state`` and ``queued_behind``, or None when the
    report is not that simple case (nothing is written then)."""
    assert set(answered) == set(ANSWER_COLUMNS)
    assert State(answered["state"]) in ANSWER_AT_ONCE_OUTCOMES
    params: dict[str, Any] = {
        "dispatch_id": dispatch_id,
        "collector_id": collector_id,
        "state": answered["state"],
        "reason": reason,
        "v_result": result,
        "v_error_code": error_code,
        **{f"a_{k}": v for k, v in answered.items()},
    }
    db = await sql(conn)
    row = await db.one(_ANSWER_AT_ONCE, params)
    if row is not None:
        db.info.setdefault(CHANGED_TASKS, set()).add(row["task_id"])
        _note_outcome(db.info, row, State(row["from_state"]), State(answered["state"]))
    return row


_INSERT_TASK = """
WITH created AS (
    INSERT INTO tasks (task_id, idempotency_key, request_sha256, provider, operation, op_class,
                       target_ref, site_id, tenant_id, params, deadline, requires_fips, labels, features,
                       protocol_floor, state, traceparent)
    VALUES (%(task_id)s, %(idempotency_key)s, %(request_sha256)s, %(provider)s, %(operation)s,
            %(op_class)s, %(target_ref)s, %(site_id)s, %(tenant_id)s, %(params)s, %(deadline)s,
            %(requires_fips)s, %(labels)s, %(features)s, %(protocol_floor)s, %(state)s, %(traceparent)s)
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


async def overdue_queued(conn: AsyncConnection, limit: int) -> Sequence[str]:
    query = (
        select(tasks.c.task_id)
        .where(tasks.c.state == State.QUEUED.value, tasks.c.deadline <= func.now())
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list((await conn.execute(query)).scalars())


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


async def queued_count(conn: AsyncConnection) -> int:
    result = await conn.execute(
        select(func.count()).select_from(tasks).where(tasks.c.state == State.QUEUED.value)
    )
    return int(result.scalar_one())
