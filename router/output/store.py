"""The SQL of streamed output (router/output/streams.py): chunks, acks, digests, quotas and retention.

A dispatch's output is a run of chunks keyed by their start offset; the
dispatch row's ``output_length`` is the ack (the highest contiguous offset
stored), moved in the same statement that stores a chunk. Each tenant's stored
bytes are counted in ``tenant_output`` and bounded there. Lock order: the
dispatch row, then the tenant's row.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.schema import output_chunks
from router.core.sql import Db, sql

_LOCK = """
SELECT d.dispatch_id, d.collector_id, d.state, d.reported_at, d.output_length, d.output_sha256,
       d.output_purged_at, t.tenant_id, t.task_id
FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
WHERE d.dispatch_id = %(id)s
FOR UPDATE OF d"""


async def lock_dispatch(conn: Db, dispatch_id: str) -> dict[str, Any] | None:
    """The dispatch (locked) with its task's tenant, for an append."""
    return await (await sql(conn)).one(_LOCK, {"id": dispatch_id})


_RESERVE = """
INSERT INTO tenant_output (tenant_id, bytes) VALUES (%(tenant)s, %(n)s)
ON CONFLICT (tenant_id) DO UPDATE SET bytes = tenant_output.bytes + EXCLUDED.bytes
WHERE tenant_output.bytes + EXCLUDED.bytes <= %(quota)s
RETURNING bytes"""


async def reserve(conn: Db, tenant_id: str, n: int, quota: int) -> bool:
    """Count ``n`` more bytes against the tenant, unless that would pass ``quota``."""
    return await (await sql(conn)).one(_RESERVE, {"tenant": tenant_id, "n": n, "quota": quota}) is not None


_APPEND = """
WITH stored AS (
    INSERT INTO output_chunks (dispatch_id, start, data) VALUES (%(id)s, %(start)s, %(data)s)
)
UPDATE dispatches SET output_length = output_length + %(n)s, updated_at = now()
WHERE dispatch_id = %(id)s
RETURNING output_length"""


async def append(conn: Db, dispatch_id: str, start: int, data: bytes) -> int:
    """Store one chunk at ``start`` and move the ack past it; the new ack."""
    row = await (await sql(conn)).one(
        _APPEND, {"id": dispatch_id, "start": start, "data": data, "n": len(data)}
    )
    assert row is not None
    return int(row["output_length"])


async def digest(conn: AsyncConnection, dispatch_id: str) -> tuple[int, str]:
    """Length and SHA-256 (hex) of the stored output, read a few chunks at a time (bounded memory)."""
    query = (
        select(output_chunks.c.data)
        .where(output_chunks.c.dispatch_id == dispatch_id)
        .order_by(output_chunks.c.start)
        .execution_options(yield_per=4)
    )
    sha, length = hashlib.sha256(), 0
    result = await conn.stream(query)
    async for (data,) in result:
        sha.update(data)
        length += len(data)
    return length, sha.hexdigest()


async def set_digest(conn: Db, dispatch_id: str, sha256: str) -> None:
    await (await sql(conn)).run(
        "UPDATE dispatches SET output_sha256 = %(sha)s WHERE dispatch_id = %(id)s",
        {"id": dispatch_id, "sha": sha256},
    )


_READ = """
SELECT start, data FROM output_chunks
WHERE dispatch_id = %(id)s
  AND start >= coalesce(
      (SELECT max(start) FROM output_chunks WHERE dispatch_id = %(id)s AND start <= %(offset)s), 0)
ORDER BY start
LIMIT %(limit)s"""


async def chunks_from(conn: Db, dispatch_id: str, offset: int, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` chunks in order, the first one holding ``offset`` (or starting after it)."""
    return await (await sql(conn)).all(_READ, {"id": dispatch_id, "offset": offset, "limit": limit})


_EXPIRED = """
SELECT d.dispatch_id, t.tenant_id, d.output_length
FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
WHERE d.output_length > 0 AND d.output_purged_at IS NULL
  AND t.state IN ('success', 'failed', 'expired', 'cancelled')
  AND t.updated_at < now() - make_interval(secs => %(retention)s)
LIMIT %(limit)s
FOR UPDATE OF d SKIP LOCKED"""

_PURGE = """
WITH gone AS (DELETE FROM output_chunks WHERE dispatch_id = %(id)s)
UPDATE tenant_output SET bytes = greatest(bytes - %(n)s, 0) WHERE tenant_id = %(tenant)s"""


async def purge_expired(conn: Db, retention_s: float, limit: int) -> int:
    """Remove the output of tasks that ended over ``retention_s`` ago (the dispatch keeps its length
    and digest); the number of outputs removed."""
    db = await sql(conn)
    rows = await db.all(_EXPIRED, {"retention": retention_s, "limit": limit})
    for row in rows:
        await db.run(
            _PURGE, {"id": row["dispatch_id"], "n": row["output_length"], "tenant": row["tenant_id"]}
        )
        await db.run(
            "UPDATE dispatches SET output_purged_at = now() WHERE dispatch_id = %(id)s",
            {"id": row["dispatch_id"]},
        )
    return len(rows)
