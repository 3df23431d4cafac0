"""The SQL of credential revocations (router/credentials/revocations.py)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from router.core.sql import Db, sql

_HOLDERS = """
SELECT d.collector_id, array_agg(d.dispatch_id ORDER BY d.dispatch_id) AS dispatch_ids,
       min(coalesce(d.handed_protocol, 1)) AS protocol
FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
WHERE d.provider = %(provider)s AND d.target_ref = %(target)s
  AND d.state IN ('dispatched', 'running') AND d.reported_at IS NULL
  AND (CAST(%(tenants)s AS text[]) IS NULL OR t.tenant_id = ANY(CAST(%(tenants)s AS text[])))
GROUP BY d.collector_id
ORDER BY d.collector_id"""


async def holders(
    conn: Db, provider: str, target_ref: str, tenants: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """Collectors running work on the device (of ``tenants``' tasks only, when given), with those
    dispatches and the oldest protocol they were handed out under."""
    params = {
        "provider": provider,
        "target": target_ref,
        "tenants": None if tenants is None else sorted(tenants),
    }
    return await (await sql(conn)).all(_HOLDERS, params)


async def create(conn: Db, revocation_id: str, ref: str, action: str, reason: str, actor: str) -> None:
    await (await sql(conn)).run(
        "INSERT INTO credential_revocations (revocation_id, credential_ref, action, reason, actor) "
        "VALUES (%(id)s, %(ref)s, %(action)s, %(reason)s, %(actor)s)",
        {"id": revocation_id, "ref": ref, "action": action, "reason": reason, "actor": actor},
    )


async def add_target(
    conn: Db, revocation_id: str, collector_id: str, dispatch_ids: Sequence[str], state: str, detail: str
) -> None:
    await (await sql(conn)).run(
        "INSERT INTO revocation_targets (revocation_id, collector_id, dispatch_ids, state, detail) "
        "VALUES (%(id)s, %(cid)s, %(dispatches)s, %(state)s, %(detail)s)",
        {"id": revocation_id, "cid": collector_id, "dispatches": list(dispatch_ids), "state": state,
         "detail": detail},
    )  # fmt: skip


_TARGETS = """
SELECT revocation_id, collector_id, dispatch_ids, state, results, detail, updated_at
FROM revocation_targets WHERE revocation_id = ANY(%(ids)s) ORDER BY collector_id"""


async def _with_targets(db: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not rows:
        return rows
    targets = await db.all(_TARGETS, {"ids": [r["revocation_id"] for r in rows]})
    for row in rows:
        row["targets"] = [t for t in targets if t["revocation_id"] == row["revocation_id"]]
    return rows


async def get(conn: Db, revocation_id: str) -> dict[str, Any] | None:
    """A revocation with its targets."""
    db = await sql(conn)
    rows = await db.all(
        "SELECT * FROM credential_revocations WHERE revocation_id = %(id)s", {"id": revocation_id}
    )
    found = await _with_targets(db, rows)
    return found[0] if found else None


async def latest(conn: Db, ref: str, limit: int) -> list[dict[str, Any]]:
    db = await sql(conn)
    rows = await db.all(
        "SELECT * FROM credential_revocations WHERE (%(ref)s = '' OR credential_ref = %(ref)s) "
        "ORDER BY created_at DESC, revocation_id LIMIT %(limit)s",
        {"ref": ref, "limit": limit},
    )
    return await _with_targets(db, rows)


_UNANSWERED_FOR = """
SELECT r.revocation_id, r.credential_ref, r.action, t.dispatch_ids
FROM revocation_targets t JOIN credential_revocations r ON r.revocation_id = t.revocation_id
WHERE t.collector_id = %(cid)s AND t.state IN ('pending', 'unreachable')
  AND (%(resume)s OR t.revocation_id = ANY(%(ids)s))
ORDER BY r.created_at"""


async def unanswered_for(conn: Db, collector_id: str, ids: list[str], resume: bool) -> list[dict[str, Any]]:
    """The collector's unanswered revocations: those in ``ids``, or with ``resume`` all of them."""
    return await (await sql(conn)).all(_UNANSWERED_FOR, {"cid": collector_id, "ids": ids, "resume": resume})


async def lock_target(conn: Db, revocation_id: str, collector_id: str) -> dict[str, Any] | None:
    return await (await sql(conn)).one(
        "SELECT * FROM revocation_targets WHERE revocation_id = %(id)s AND collector_id = %(cid)s FOR UPDATE",
        {"id": revocation_id, "cid": collector_id},
    )


async def answer(
    conn: Db, revocation_id: str, collector_id: str, state: str, results: Mapping[str, str], detail: str
) -> None:
    await (await sql(conn)).run(
        "UPDATE revocation_targets SET state = %(state)s, results = %(results)s::jsonb, detail = %(detail)s, "
        "updated_at = now() WHERE revocation_id = %(id)s AND collector_id = %(cid)s",
        {"id": revocation_id, "cid": collector_id, "state": state, "results": json.dumps(dict(results)),
         "detail": detail},
    )  # fmt: skip


async def mark_unreachable(conn: Db, after: dt.timedelta) -> int:
    return await (await sql(conn)).run(
        "UPDATE revocation_targets SET state = 'unreachable', updated_at = now() "
        "WHERE state = 'pending' AND updated_at < now() - %(after)s",
        {"after": after},
    )


async def unanswered(conn: Db, limit: int = 1000) -> list[dict[str, Any]]:
    return await (await sql(conn)).all(
        "SELECT revocation_id, collector_id FROM revocation_targets "
        "WHERE state IN ('pending', 'unreachable') ORDER BY updated_at LIMIT %(limit)s",
        {"limit": limit},
    )
