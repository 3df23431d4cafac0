"""Cancel of work a collector holds, resume verdicts and per-feature floors, over real sockets
(gateway, router gRPC, PostgreSQL, Redis): docs/protocol.md."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import select
from versus.router.v1 import task_pb2
from versus.router.v1 import task_router_pb2 as pb

from common import protocol
from common.db.schema import tasks
from common.error_mapping import GRPC_CODE_METADATA_KEY
from router.dispatch import cancels
from tests.integration.test_gateway_collector import API, Collector, Stack, running_stack
from tests.support.collector_auth import with_report_signature

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

V3 = {"min": 1, "max": 3}


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        yield running


async def _claim(stack: Stack, c: Collector, offer: dict[str, int] | None, **body: Any) -> httpx.Response:
    """A claim as a collector offering ``offer`` sends it (None: one from before negotiation)."""
    version = offer["max"] if offer else 1
    fields: dict[str, Any] = {"wait_s": 0, "session_id": f"s-{c.collector_id}", **body}
    if offer:
        fields["protocol"] = offer
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        return await client.post(
            API + "/claim", json=fields, auth=c.auth, headers={protocol.HEADER: str(version)}
        )


async def _report(stack: Stack, c: Collector, dispatch_id: str, outcome: str, **body: Any) -> httpx.Response:
    signed = with_report_signature(
        c.key, c.collector_id, {"task_id": dispatch_id, "outcome": outcome, **body}
    )
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        return await client.post(API + "/report", json=signed, auth=c.auth, headers={protocol.HEADER: "3"})


async def _submit(stack: Stack, key: str, *features: str) -> task_pb2.Task:
    deadline = Timestamp()
    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    reply = await stack.tasks.SubmitTask(
        pb.SubmitTaskRequest(
            provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ, target_ref=f"dev-{key}",
            site_id=stack.site_id, tenant_id="tenant-g", params=b"{}", idempotency_key=key,
            deadline=deadline, features=list(features),
        )
    )  # fmt: skip
    return reply.task


async def _task(stack: Stack, task_id: str) -> task_pb2.Task:
    return (await stack.tasks.GetTask(pb.GetTaskRequest(task_id=task_id))).task


def _state(task: task_pb2.Task) -> str:
    return task_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower()


async def _connected(stack: Stack, name: str, offer: dict[str, int] | None) -> Collector:
    c = await stack.enroll(name)
    assert (await stack.publish(c)).status_code == 200
    assert (await _claim(stack, c, offer)).status_code == 204
    return c


async def test_a_cancel_reaches_the_collector_on_its_held_claim_and_the_task_ends_cancelled(
    stack: Stack,
) -> None:
    c = await _connected(stack, "col-c", V3)
    task = await _submit(stack, "cancel-1", "cancel")
    got = await _claim(stack, c, V3, claim_seq=1)
    dispatch_id = got.json()["dispatch_id"]
    # A long-poll holding for work, as a collector's claim does while its task runs.
    held = asyncio.ensure_future(_claim(stack, c, V3, claim_seq=2, held_task_ids=[dispatch_id], wait_s=20))
    await asyncio.sleep(0.3)
    asked = (await stack.tasks.CancelTask(pb.CancelTaskRequest(task_id=task.task_id, reason="stop"))).task
    # The task stays with its collector until it answers; the request is recorded and visible.
    assert _state(asked) == "dispatched" and asked.HasField("cancel_requested_at")
    async with asyncio.timeout(5):  # at once, not at the end of the 20 s hold
        answer = await held
    assert answer.status_code == 200
    assert answer.json()["verdicts"] == {dispatch_id: "cancel"}
    assert answer.json()["cancel_grace_s"] == cancels.CANCEL_GRACE_S
    # Asking again changes nothing and answers the same.
    again = (await stack.tasks.CancelTask(pb.CancelTaskRequest(task_id=task.task_id))).task
    assert again.cancel_requested_at == asked.cancel_requested_at
    reported = await _report(stack, c, dispatch_id, "cancelled", error_code="cancelled")
    assert reported.json()["state"] == "cancelled", reported.text
    final = await _task(stack, task.task_id)
    reasons = [h.reason for h in final.history]
    assert _state(final) == "cancelled" and "cancel requested: stop" in reasons


async def test_a_collector_that_took_the_task_under_protocol_1_cannot_be_asked_to_stop_it(
    stack: Stack,
) -> None:
    old = await _connected(stack, "col-old", None)
    task = await _submit(stack, "cancel-old")  # needs no feature: an old collector may run it
    assert (await _claim(stack, old, None, claim_seq=1)).status_code == 200
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.tasks.CancelTask(pb.CancelTaskRequest(task_id=task.task_id))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    metadata: Any = refused.value.trailing_metadata() or ()
    assert dict(metadata)[GRPC_CODE_METADATA_KEY] == "cancel_unsupported"
    assert "protocol 1" in (refused.value.details() or "")
    assert _state(await _task(stack, task.task_id)) == "dispatched"  # untouched


async def test_a_task_needing_a_feature_waits_with_the_floor_named_until_a_collector_reaches_it(
    stack: Stack,
) -> None:
    old = await _connected(stack, "col-v2", {"min": 1, "max": 2})
    task = await _submit(stack, "floor-1", "cancel")
    waiting = await _task(stack, task.task_id)
    assert (_state(waiting), waiting.condition) == ("queued", "needs protocol ≥ 3 for cancel")
    assert list(waiting.features) == ["cancel"]
    # The old collector keeps running everything else.
    other = await _submit(stack, "floor-2")
    got = (await _claim(stack, old, {"min": 1, "max": 2}, claim_seq=1)).json()
    assert got["dispatch_id"] and _state(await _task(stack, other.task_id)) == "dispatched"
    # A collector that settles 3 comes: the waiting task is placed on it, and only on it.
    new = await stack.enroll("col-v3")
    assert (await stack.publish(new)).status_code == 200
    # Its first claim makes it live at 3: the waiting task is placed on it and handed to that claim.
    handed = await _claim(stack, new, V3, claim_seq=1, wait_s=5)
    assert handed.status_code == 200
    placed = await _task(stack, task.task_id)
    assert _state(placed) == "dispatched" and placed.condition == ""
    again = await _claim(stack, old, {"min": 1, "max": 2}, claim_seq=2, held_task_ids=[got["dispatch_id"]])
    assert again.status_code == 204


async def test_a_resume_claim_gets_a_verdict_on_every_held_task_even_after_redis_lost_the_cancel(
    stack: Stack,
) -> None:
    c = await _connected(stack, "col-r", V3)
    first = await _submit(stack, "resume-1", "cancel")
    second = await _submit(stack, "resume-2", "cancel")
    one = (await _claim(stack, c, V3, claim_seq=1)).json()["dispatch_id"]
    two = (await _claim(stack, c, V3, claim_seq=2, held_task_ids=[one])).json()["dispatch_id"]
    held = [one, two, "dsp-not-ours"]
    answer = await _claim(stack, c, V3, claim_seq=3, held_task_ids=held, resume=True)
    assert answer.json()["verdicts"] == {one: "continue", two: "continue", "dsp-not-ours": "terminate"}
    await stack.tasks.CancelTask(pb.CancelTaskRequest(task_id=second.task_id))
    await stack.redis.flushall()  # the note in Redis is gone; PostgreSQL still holds the request
    answer = await _claim(stack, c, V3, claim_seq=4, held_task_ids=held, resume=True)
    assert answer.json()["verdicts"] == {one: "continue", two: "cancel", "dsp-not-ours": "terminate"}
    assert _state(await _task(stack, first.task_id)) == "dispatched"


async def test_a_cancel_whose_note_was_lost_is_noted_again_by_the_sweeper(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = await _connected(stack, "col-s", V3)
    task = await _submit(stack, "renotify-1", "cancel")
    dispatch_id = (await _claim(stack, c, V3, claim_seq=1)).json()["dispatch_id"]
    await stack.tasks.CancelTask(pb.CancelTaskRequest(task_id=task.task_id))
    await stack.redis.flushall()
    assert (await _claim(stack, c, V3, claim_seq=2, held_task_ids=[dispatch_id])).status_code == 204
    monkeypatch.setattr(cancels, "RENOTIFY_AFTER_S", 0)
    assert (await stack.router.sweep())["cancels"] == 1
    answer = await _claim(stack, c, V3, claim_seq=3, held_task_ids=[dispatch_id])
    assert answer.json()["verdicts"] == {dispatch_id: "cancel"}


async def test_a_cancelled_task_its_collector_never_received_is_not_placed_again(stack: Stack) -> None:
    c = await _connected(stack, "col-n", V3)
    task = await _submit(stack, "lost-1", "cancel")
    assert (await _claim(stack, c, V3, claim_seq=1)).status_code == 200
    await stack.tasks.CancelTask(pb.CancelTaskRequest(task_id=task.task_id))
    # The next numbered claim does not hold it: it never arrived. Cancelled, not queued again.
    assert (await _claim(stack, c, V3, claim_seq=2)).status_code in (200, 204)
    async with stack.router.engine.connect() as conn:
        state = await conn.scalar(select(tasks.c.state).where(tasks.c.task_id == task.task_id))
    assert state == "cancelled"
