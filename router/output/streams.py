"""Streamed task output (protocol 4, docs/protocol.md "Output streams").

A collector sends a dispatch's output in chunks, each at its byte offset. A
chunk is stored only when it starts exactly at the ack, the highest contiguous
offset stored so far (``dispatches.output_length``): one starting past it is a
gap, one starting before it an overlap, and both are answered with the ack so
the collector resumes from there, after a lost answer, a reconnect or a
gateway or router restart alike. Nothing is ever held in memory beyond one
chunk: chunks go straight to PostgreSQL, and digests and reads walk them a few
at a time.

The final report names the output's length and SHA-256. A report that names
more than is stored is refused (``output_incomplete``, with the ack) so the
collector finishes the upload first; one whose digest differs from what is
stored fails the task (``output_digest_mismatch``): the bytes a platform would
read are not the ones the collector sent.

Bounds: :data:`MAX_OUTPUT_CHUNK` per chunk, ``output_task_limit`` per
dispatch, ``output_tenant_quota`` per tenant (``output_quota_exceeded``).
Retention: the sweeper removes the output of tasks that ended more than
``output_retention_s`` ago (the dispatch keeps its length and digest).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from common.errors import (
    Conflict,
    FailedPrecondition,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ResourceExhausted,
)
from common.limits import MAX_OUTPUT_CHUNK
from router.core import store
from router.core.base import RouterCore
from router.core.sql import Row
from router.core.states import TERMINAL, State
from router.output import store as output_store

# Chunks read per round trip when serving ReadOutput (each at most MAX_OUTPUT_CHUNK).
READ_BATCH = 4
# How often a following reader looks for more output.
FOLLOW_POLL_S = 0.25


class Appended(enum.StrEnum):
    APPENDED = "appended"
    GAP = "gap"
    OVERLAP = "overlap"


@dataclass(frozen=True, slots=True)
class OutputChunk:
    offset: int
    data: bytes
    complete: bool = False
    length: int = 0
    sha256: str = ""


def place(offset: int, acked: int) -> Appended:
    """Where a chunk at ``offset`` falls against the ack. Pure."""
    if offset == acked:
        return Appended.APPENDED
    return Appended.GAP if offset > acked else Appended.OVERLAP


class Outputs(RouterCore):
    """Appending, verifying, reading and retiring streamed output."""

    async def append_output(
        self, collector_id: str, dispatch_id: str, offset: int, data: bytes
    ) -> tuple[Appended, int]:
        """Store a chunk at ``offset`` if it starts at the ack; (what happened, the ack after)."""
        if len(data) > MAX_OUTPUT_CHUNK:
            raise PayloadTooLarge(
                f"an output chunk is at most {MAX_OUTPUT_CHUNK} bytes", code="chunk_too_large"
            )
        async with self.engine.begin() as conn:
            d = await output_store.lock_dispatch(conn, dispatch_id)
            if d is None or d["collector_id"] != collector_id:
                raise PermissionDenied(
                    f"dispatch {dispatch_id!r} was not dispatched to you", code="not_your_dispatch"
                )
            acked = int(d["output_length"])
            if d["reported_at"] is not None or d["state"] not in (State.DISPATCHED, State.RUNNING):
                raise FailedPrecondition(
                    f"dispatch is {d['state']}; no more output is taken", code="report_not_expected"
                )
            where = place(offset, acked)
            if where is not Appended.APPENDED or not data:
                return where, acked
            if acked + len(data) > self.output_task_limit:
                raise ResourceExhausted(
                    f"a task's output is at most {self.output_task_limit} bytes", code="output_too_large"
                )
            if not await output_store.reserve(conn, d["tenant_id"], len(data), self.output_tenant_quota):
                raise ResourceExhausted(
                    f"tenant {d['tenant_id']} holds {self.output_tenant_quota} bytes of output already; "
                    "older output is removed as it passes retention",
                    code="output_quota_exceeded",
                )
            return Appended.APPENDED, await output_store.append(conn, dispatch_id, offset, data)

    async def _check_output(self, conn: AsyncConnection, d: Row, claimed: tuple[int, str] | None) -> str:
        """Verify the output a final report names against what is stored (see the module doc); the
        error code the task fails with ("" when it is right, or when nothing was streamed)."""
        stored = int(d["output_length"])
        if claimed is None:
            return ""
        length, sha256 = claimed
        if length > stored:
            raise Conflict(
                f"the report names {length} bytes of output; {stored} are stored: send the rest first",
                code="output_incomplete",
                details={"acked": stored},
            )
        got_length, got_sha = await output_store.digest(conn, d["dispatch_id"])
        if (got_length, got_sha) != (length, sha256.lower()):
            return "output_digest_mismatch"
        await output_store.set_digest(conn, d["dispatch_id"], got_sha)
        return ""

    async def read_output(self, task_id: str, offset: int, follow: bool) -> AsyncIterator[OutputChunk]:
        """The task's output from ``offset`` (its current attempt's), then with ``follow`` what
        arrives until the task is terminal; the last chunk says ``complete``."""
        sent = offset
        while True:
            async with self.autocommit.connect() as conn:
                task = await store.get_task(conn, task_id)
                if task is None:
                    raise NotFound(f"task {task_id!r} does not exist", code="task_not_found")
                dispatch_id = task["current_dispatch_id"]
                d = await store.get_dispatch(conn, dispatch_id) if dispatch_id else None
                if d is not None and d["output_purged_at"] is not None:
                    raise FailedPrecondition(
                        "this task's output passed retention and was removed", code="output_purged"
                    )
                rows = await output_store.chunks_from(conn, dispatch_id, sent, READ_BATCH) if d else []
            before = sent
            for row in rows:
                start, data = int(row["start"]), bytes(row["data"])
                if start + len(data) <= sent:
                    continue  # the chunk that ends where the last read stopped
                yield OutputChunk(sent, data[sent - start :])
                sent = start + len(data)
            if sent > before:
                continue  # there may be more already stored
            done = State(task["state"]) in TERMINAL or State(task["state"]) == State.INDETERMINATE
            if done or not follow:
                length = int(d["output_length"]) if d else 0
                sha = (d["output_sha256"] or "") if d else ""
                yield OutputChunk(sent, b"", complete=done, length=length, sha256=sha)
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    async def purge_outputs(self, batch: int = 100) -> int:
        async with self.engine.begin() as conn:
            return await output_store.purge_expired(conn, self.output_retention_s, batch)
