"""Streamed output over real sockets (gateway, router gRPC, PostgreSQL): offsets and acks, gaps and
overlaps refused with the ack, the final report's digest checked, reads from an offset, quotas and
retention (docs/protocol.md, "Output streams")."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, select, update
from versus.router.v1 import task_pb2
from versus.router.v1 import task_router_pb2 as pb

from common import protocol
from common.db.schema import output_chunks, tasks, tenant_output
from tests.integration.test_gateway_collector import API, Collector, Stack, running_stack
from tests.support.collector_auth import with_report_signature

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

V4 = {"min": 1, "max": 4}


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        yield running


async def _post(stack: Stack, c: Collector, path: str, version: int = 4, **kw: Any) -> httpx.Response:
    headers = {protocol.HEADER: str(version), **kw.pop("headers", {})}
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        return await client.post(API + path, auth=c.auth, headers=headers, **kw)


async def _chunk(
    stack: Stack, c: Collector, dispatch_id: str, offset: int, data: bytes, version: int = 4
) -> httpx.Response:
    return await _post(
        stack, c, f"/output?task_id={dispatch_id}&offset={offset}", version,
        content=data, headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip


async def _report(
    stack: Stack, c: Collector, dispatch_id: str, output: dict[str, Any] | None
) -> httpx.Response:
    body: dict[str, Any] = {"task_id": dispatch_id, "outcome": "success"}
    if output is not None:
        body["output"] = output
    return await _post(stack, c, "/report", json=with_report_signature(c.key, c.collector_id, body))


async def _running(stack: Stack, name: str, key: str) -> tuple[Collector, str, str]:
    """A collector at protocol 4 holding a dispatched task that needs an output stream."""
    c = await stack.enroll(name)
    assert (await stack.publish(c)).status_code == 200
    # Live at protocol 4 before the task is placed, and idle: the task goes to this collector.
    hello = {"wait_s": 0, "session_id": f"s-{name}", "protocol": V4, "claim_seq": 1}
    assert (await _post(stack, c, "/claim", json=hello)).status_code == 204
    deadline = Timestamp()
    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    task = (
        await stack.tasks.SubmitTask(
            pb.SubmitTaskRequest(
                provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ, target_ref=f"dev-{key}",
                site_id=stack.site_id, tenant_id="tenant-g", params=b"{}", idempotency_key=key,
                deadline=deadline, features=["output_stream"],
            )
        )
    ).task  # fmt: skip
    claim = {"wait_s": 2, "session_id": f"s-{name}", "protocol": V4, "claim_seq": 2}
    got = await _post(stack, c, "/claim", json=claim)
    assert got.status_code == 200, got.text
    return c, task.task_id, got.json()["dispatch_id"]


async def _read(
    stack: Stack, task_id: str, offset: int = 0, follow: bool = False
) -> list[pb.ReadOutputResponse]:
    call = stack.tasks.ReadOutput(pb.ReadOutputRequest(task_id=task_id, offset=offset, follow=follow))
    return [m async for m in call]


async def test_chunks_are_stored_at_the_ack_and_a_gap_or_overlap_is_answered_with_it(stack: Stack) -> None:
    c, task_id, dispatch_id = await _running(stack, "col-o1", "out-1")
    first, second = b"a" * 1000, b"b" * 500
    stored = await _chunk(stack, c, dispatch_id, 0, first)
    assert (stored.status_code, stored.json()) == (200, {"acked": 1000})
    # Past the ack: a gap. Before it (a resend whose answer was lost): an overlap. Both say the ack.
    for offset, code in ((1500, "output_gap"), (0, "output_overlap"), (999, "output_overlap")):
        refused = await _chunk(stack, c, dispatch_id, offset, second)
        error = refused.json()["error"]
        assert (refused.status_code, error["code"], error["details"]) == (409, code, {"acked": 1000})
    assert (await _chunk(stack, c, dispatch_id, 1000, second)).json() == {"acked": 1500}
    # A platform reads what has arrived while the task runs, from any offset.
    so_far = await _read(stack, task_id, offset=900)
    assert b"".join(m.data for m in so_far) == (first + second)[900:]
    assert so_far[0].offset == 900 and not so_far[-1].complete
    # The final report vouches for all of it; the digest is checked and kept.
    digest = hashlib.sha256(first + second).hexdigest()
    done = await _report(stack, c, dispatch_id, {"length": 1500, "sha256": digest})
    assert done.json()["state"] == "success", done.text
    got = (await stack.tasks.GetTask(pb.GetTaskRequest(task_id=task_id))).task
    assert (got.output_length, got.output_sha256) == (1500, digest)
    after = await _read(stack, task_id)
    assert b"".join(m.data for m in after) == first + second
    assert (after[-1].complete, after[-1].length, after[-1].sha256) == (True, 1500, digest)
    # Nothing is taken once the report is in.
    late = await _chunk(stack, c, dispatch_id, 1500, b"late")
    assert (late.status_code, late.json()["error"]["code"]) == (412, "report_not_expected")


async def test_a_report_naming_more_output_than_stored_is_refused_with_the_ack(stack: Stack) -> None:
    c, _, dispatch_id = await _running(stack, "col-o2", "out-2")
    data = bytes(range(256)) * 16
    await _chunk(stack, c, dispatch_id, 0, data[:1000])
    early = await _report(
        stack, c, dispatch_id, {"length": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    )
    error = early.json()["error"]
    assert (early.status_code, error["code"], error["details"]) == (409, "output_incomplete", {"acked": 1000})
    await _chunk(stack, c, dispatch_id, 1000, data[1000:])
    done = await _report(
        stack, c, dispatch_id, {"length": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    )
    assert done.json()["state"] == "success"


async def test_a_digest_that_differs_from_the_stored_bytes_fails_the_task(stack: Stack) -> None:
    c, task_id, dispatch_id = await _running(stack, "col-o3", "out-3")
    await _chunk(stack, c, dispatch_id, 0, b"what was stored")
    wrong = hashlib.sha256(b"what the collector thinks it sent").hexdigest()
    done = await _report(stack, c, dispatch_id, {"length": 15, "sha256": wrong})
    assert done.json()["state"] == "failed"
    got = (await stack.tasks.GetTask(pb.GetTaskRequest(task_id=task_id))).task
    assert got.error_code == "output_digest_mismatch" and got.output_sha256 == ""


async def test_output_needs_protocol_4_and_the_right_media_type_and_size(stack: Stack) -> None:
    c, _, dispatch_id = await _running(stack, "col-o4", "out-4")
    old = await _chunk(stack, c, dispatch_id, 0, b"x", version=3)
    assert (old.status_code, old.json()["error"]["code"]) == (400, "version_unsupported")
    as_json = await _post(stack, c, f"/output?task_id={dispatch_id}&offset=0", json={"x": 1})
    assert (as_json.status_code, as_json.json()["error"]["code"]) == (415, "unsupported_media_type")
    huge = await _chunk(stack, c, dispatch_id, 0, b"x" * (1024 * 1024 + 1))
    assert (huge.status_code, huge.json()["error"]["code"]) == (413, "body_too_large")
    # Someone else's dispatch: the same answer as one that does not exist.
    other = await stack.enroll("col-o4b")
    foreign = await _chunk(stack, other, dispatch_id, 0, b"x")
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (403, "not_your_dispatch")
    # A report naming an output is a protocol-4 message too.
    body = with_report_signature(
        c.key, c.collector_id,
        {"task_id": dispatch_id, "outcome": "success", "output": {"length": 0, "sha256": "0" * 64}},
    )  # fmt: skip
    refused = await _post(stack, c, "/report", version=3, json=body)
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "version_unsupported")


async def test_per_task_and_per_tenant_bounds_and_retention(stack: Stack) -> None:
    stack.router.output_task_limit = 3000
    stack.router.output_tenant_quota = 4000
    c, task_id, dispatch_id = await _running(stack, "col-o5", "out-5")
    assert (await _chunk(stack, c, dispatch_id, 0, b"x" * 2500)).status_code == 200
    too_big = await _chunk(stack, c, dispatch_id, 2500, b"x" * 501)
    assert (too_big.status_code, too_big.json()["error"]["code"]) == (429, "output_too_large")
    c2, _, dispatch2 = await _running(stack, "col-o6", "out-6")
    assert (await _chunk(stack, c2, dispatch2, 0, b"y" * 1500)).status_code == 200
    over = await _chunk(stack, c2, dispatch2, 1500, b"y" * 1)
    assert (over.status_code, over.json()["error"]["code"]) == (429, "output_quota_exceeded")
    # Retention: once a task has been over for longer than it, its output goes and the quota frees.
    await _report(stack, c, dispatch_id, {"length": 2500, "sha256": hashlib.sha256(b"x" * 2500).hexdigest()})
    stack.router.output_retention_s = 60.0
    async with stack.router.engine.begin() as conn:
        await conn.execute(
            update(tasks)
            .where(tasks.c.task_id == task_id)
            .values(updated_at=func.now() - dt.timedelta(minutes=2))
        )
    assert (await stack.router.sweep())["outputs_purged"] == 1
    async with stack.router.engine.connect() as conn:
        left = await conn.scalar(select(func.count()).where(output_chunks.c.dispatch_id == dispatch_id))
        held = await conn.scalar(select(tenant_output.c.bytes).where(tenant_output.c.tenant_id == "tenant-g"))
    assert (left, held) == (0, 1500)
    assert (await _chunk(stack, c2, dispatch2, 1500, b"y" * 1000)).status_code == 200
    with pytest.raises(grpc.aio.AioRpcError, match="retention") as purged:
        await _read(stack, task_id)
    assert purged.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (await stack.tasks.GetTask(pb.GetTaskRequest(task_id=task_id))).task.output_length == 2500


async def test_a_following_reader_gets_output_as_it_arrives_and_ends_with_the_task(stack: Stack) -> None:
    c, task_id, dispatch_id = await _running(stack, "col-o7", "out-7")
    reader = asyncio.ensure_future(_read(stack, task_id, follow=True))
    sent = b""
    for i in range(5):
        piece = bytes([i]) * (100 + i)
        assert (await _chunk(stack, c, dispatch_id, len(sent), piece)).status_code == 200
        sent += piece
        await asyncio.sleep(0.1)
    assert not reader.done()  # still following: the task runs
    await _report(stack, c, dispatch_id, {"length": len(sent), "sha256": hashlib.sha256(sent).hexdigest()})
    async with asyncio.timeout(10):
        got = await reader
    assert b"".join(m.data for m in got) == sent and got[-1].complete
