"""Credential revocation over real sockets (gateway, router gRPC, PostgreSQL, Redis): delivery on the
held claim, the collector's ack, unreachable collectors replayed when they return, collectors too old
to ask, and the audit trail (docs/protocol.md, "Credential revocation")."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import select
from versus.credential.v1 import credential_pb2 as cpb
from versus.credential.v1 import credential_pb2_grpc
from versus.router.v1 import task_pb2
from versus.router.v1 import task_router_pb2 as pb

from common import protocol
from common.db.schema import audit_events
from common.grpc.client import aio_channel
from router.credentials import revocations
from tests.integration.test_gateway_collector import API, Collector, Stack, running_stack

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

V5 = {"min": 1, "max": 5}


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        yield running


@pytest.fixture
async def credentials(stack: Stack) -> AsyncIterator[Any]:
    channel = aio_channel(stack.grpc_address, stack.platform_token)
    yield credential_pb2_grpc.CredentialServiceStub(channel)
    await channel.close(None)


async def _post(stack: Stack, c: Collector, path: str, body: Any, version: int = 5) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        return await client.post(API + path, json=body, auth=c.auth, headers={protocol.HEADER: str(version)})


async def _claim(stack: Stack, c: Collector, offer: dict[str, int], **body: Any) -> httpx.Response:
    fields = {"wait_s": 0, "session_id": f"s-{c.collector_id}", "protocol": offer, **body}
    return await _post(stack, c, "/claim", fields, offer["max"])


async def _running(stack: Stack, name: str, device: str, offer: dict[str, int] = V5) -> tuple[Collector, str]:
    """A collector (live at ``offer``'s newest version) running a task on ``device``."""
    c = await stack.enroll(name)
    assert (await stack.publish(c)).status_code == 200
    assert (await _claim(stack, c, offer, claim_seq=1)).status_code == 204
    deadline = Timestamp()
    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    await stack.tasks.SubmitTask(
        pb.SubmitTaskRequest(
            provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ, target_ref=device,
            site_id=stack.site_id, tenant_id="tenant-g", params=b"{}", idempotency_key=f"k-{name}",
            deadline=deadline,
        )
    )  # fmt: skip
    got = await _claim(stack, c, offer, claim_seq=2, wait_s=2)
    assert got.status_code == 200, got.text
    return c, got.json()["dispatch_id"]


async def _revocation(credentials: Any, revocation_id: str) -> Any:
    return (await credentials.GetRevocation(cpb.GetRevocationRequest(revocation_id=revocation_id))).revocation


async def _ack(stack: Stack, c: Collector, revocation_id: str, results: dict[str, str]) -> Any:
    return (await _post(stack, c, "/revoked", {"revocation_id": revocation_id, "results": results})).json()


def _state(value: cpb.RevocationState.ValueType) -> str:
    return cpb.RevocationState.Name(value).removeprefix("REVOCATION_STATE_").lower()


async def test_a_revoke_reaches_the_holder_on_its_held_claim_and_ends_revoked_with_its_ack(
    stack: Stack, credentials: Any
) -> None:
    c, dispatch_id = await _running(stack, "col-r1", "dev-r1")
    held = asyncio.ensure_future(_claim(stack, c, V5, claim_seq=3, held_task_ids=[dispatch_id], wait_s=20))
    await asyncio.sleep(0.3)
    asked = (
        await credentials.RevokeCredential(
            cpb.RevokeCredentialRequest(
                credential_ref="stub:dev-r1", action=cpb.REVOKE_ACTION_SCRUB, reason="leaked in a ticket"
            )
        )
    ).revocation
    assert _state(asked.state) == "pending"
    assert [(t.collector_id, list(t.dispatch_ids)) for t in asked.targets] == [("col-r1", [dispatch_id])]
    async with asyncio.timeout(5):  # at once, not at the end of the hold
        answer = (await held).json()
    assert answer["revokes"] == [
        {"revocation_id": asked.revocation_id, "credential_ref": "stub:dev-r1", "action": "scrub",
         "dispatch_ids": [dispatch_id]}
    ]  # fmt: skip
    assert await _ack(stack, c, asked.revocation_id, {dispatch_id: "scrubbed"}) == {"recorded": True}
    got = await _revocation(credentials, asked.revocation_id)
    assert _state(got.state) == "revoked"
    assert dict(got.targets[0].results) == {dispatch_id: "scrubbed"}
    # The revocation may be carried again before the ack is recorded, and answered again: the
    # first answer stands (after a kill the second would find the task gone: "not_held").
    assert await _ack(stack, c, asked.revocation_id, {dispatch_id: "not_held"}) == {"recorded": True}
    got = await _revocation(credentials, asked.revocation_id)
    assert dict(got.targets[0].results) == {dispatch_id: "scrubbed"}
    async with stack.router.engine.connect() as conn:
        actions = set(
            await conn.scalars(
                select(audit_events.c.action).where(audit_events.c.action.like("credential.%"))
            )
        )
    assert actions == {"credential.revoke", "credential.revoke_ack"}
    # Another collector cannot answer for it.
    other = await stack.enroll("col-r1b")
    foreign = await _post(stack, other, "/revoked", {"revocation_id": asked.revocation_id, "results": {}})
    assert foreign.json() == {"recorded": False}


async def test_an_offline_holder_is_unreachable_until_it_returns_and_answers(
    stack: Stack, credentials: Any
) -> None:
    c, dispatch_id = await _running(stack, "col-r2", "dev-r2")
    assert (await _post(stack, c, "/bye", {"session_id": "s-col-r2"})).json()["current"]
    asked = (
        await credentials.RevokeCredential(
            cpb.RevokeCredentialRequest(credential_ref="stub:dev-r2", action=cpb.REVOKE_ACTION_KILL)
        )
    ).revocation
    assert _state(asked.state) == "unreachable"
    # It comes back: its resume claim carries every revocation it has not answered.
    back = await _claim(stack, c, V5, claim_seq=3, held_task_ids=[dispatch_id], resume=True)
    assert [r["revocation_id"] for r in back.json()["revokes"]] == [asked.revocation_id]
    assert back.json()["revokes"][0]["action"] == "kill"
    await _post(
        stack, c, "/revoked", {"revocation_id": asked.revocation_id, "results": {dispatch_id: "killed"}}
    )
    got = await _revocation(credentials, asked.revocation_id)
    assert _state(got.state) == "revoked"


async def test_an_unanswered_revoke_turns_unreachable_and_is_noted_again(
    stack: Stack, credentials: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, dispatch_id = await _running(stack, "col-r3", "dev-r3")
    request = cpb.RevokeCredentialRequest(credential_ref="stub:dev-r3", action=cpb.REVOKE_ACTION_SCRUB)
    asked = (await credentials.RevokeCredential(request)).revocation
    await stack.redis.flushall()  # the note is lost, and the collector never answered
    monkeypatch.setattr(revocations, "REVOKE_ACK_S", 0)
    await asyncio.sleep(0.01)
    assert (await stack.router.sweep())["revokes_noted"] == 1
    got = await _revocation(credentials, asked.revocation_id)
    assert _state(got.state) == "unreachable"
    answer = await _claim(stack, c, V5, claim_seq=3, held_task_ids=[dispatch_id])
    assert [r["revocation_id"] for r in answer.json()["revokes"]] == [asked.revocation_id]


async def test_a_collector_too_old_to_be_asked_is_failed_at_once_and_a_failed_scrub_says_so(
    stack: Stack, credentials: Any
) -> None:
    await _running(stack, "col-r4", "dev-r4", offer={"min": 1, "max": 4})
    request = cpb.RevokeCredentialRequest(credential_ref="stub:dev-r4", action=cpb.REVOKE_ACTION_SCRUB)
    asked = (await credentials.RevokeCredential(request)).revocation
    assert _state(asked.state) == "failed"
    assert "protocol 4" in asked.targets[0].detail
    c, dispatch_id = await _running(stack, "col-r5", "dev-r5")
    request = cpb.RevokeCredentialRequest(credential_ref="stub:dev-r5", action=cpb.REVOKE_ACTION_SCRUB)
    asked = (await credentials.RevokeCredential(request)).revocation
    await _post(stack, c, "/revoked", {"revocation_id": asked.revocation_id,
                                       "results": {dispatch_id: "failed: PermissionError"}})  # fmt: skip
    got = await _revocation(credentials, asked.revocation_id)
    assert _state(got.state) == "failed" and "PermissionError" in got.targets[0].detail


async def test_nothing_running_with_it_is_revoked_at_once_and_bad_names_are_refused(
    stack: Stack, credentials: Any
) -> None:
    request = cpb.RevokeCredentialRequest(credential_ref="ssh:nobody-uses-it", action=cpb.REVOKE_ACTION_SCRUB)
    asked = (await credentials.RevokeCredential(request)).revocation
    assert (_state(asked.state), list(asked.targets)) == ("revoked", [])
    listed = await credentials.ListRevocations(
        cpb.ListRevocationsRequest(credential_ref="ssh:nobody-uses-it")
    )
    assert [r.revocation_id for r in listed.revocations] == [asked.revocation_id]
    with pytest.raises(Exception, match="provider"):
        await credentials.RevokeCredential(
            cpb.RevokeCredentialRequest(credential_ref="no-colon", action=cpb.REVOKE_ACTION_SCRUB)
        )
    # The ack is a protocol-5 message.
    c = await stack.enroll("col-r6")
    old = await _post(stack, c, "/revoked", {"revocation_id": asked.revocation_id, "results": {}}, version=4)
    assert (old.status_code, old.json()["error"]["code"]) == (400, "version_unsupported")
