"""Vault mode B in flight over real sockets: a mode-B collector's claim carries its dispatch's
device credential encrypted to its key and signed; PostgreSQL holds no plaintext; an older
collector in mode B takes no work (docs/vault.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import select, text, update
from versus.router.v1 import task_pb2
from versus.router.v1 import task_router_pb2 as pb

from common import protocol
from common.db.schema import audit_events, collectors, dispatches
from common.trust import signed_doc
from common.trust.credential_relay import open_for
from router.credentials.store import CredentialStore
from router.credentials.vault import MasterKeys
from router.fleet.operations import Fleet
from tests.integration.test_gateway_collector import API, Collector, Stack, running_stack

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

SECRET = "relayed-secret-4711"
VALUE = {"token": SECRET}


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        master = MasterKeys("mk-1", {"mk-1": os.urandom(32)})
        running.router.credential_store = CredentialStore(running.router.engine, master)
        yield running


async def _claim(stack: Stack, c: Collector, newest: int, **body: Any) -> httpx.Response:
    fields = {"wait_s": 0, "session_id": f"s-{c.collector_id}", "protocol": {"min": 1, "max": newest}, **body}
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        return await client.post(
            API + "/claim", json=fields, auth=c.auth, headers={protocol.HEADER: str(newest)}
        )


async def _mode_b(stack: Stack, name: str, newest: int) -> Collector:
    c = await stack.enroll(name)
    assert (await stack.publish(c)).status_code == 200
    async with stack.router.engine.begin() as conn:
        await conn.execute(
            update(collectors).where(collectors.c.collector_id == name).values(vault_mode="relayed")
        )
    stack.router.candidates.invalidate()
    assert (await _claim(stack, c, newest, claim_seq=1)).status_code == 204
    return c


async def _submit(stack: Stack, device: str) -> task_pb2.Task:
    deadline = Timestamp()
    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    return (
        await stack.tasks.SubmitTask(
            pb.SubmitTaskRequest(
                provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ, target_ref=device,
                site_id=stack.site_id, tenant_id="tenant-g", params=b"{}", idempotency_key=f"k-{device}",
                deadline=deadline,
            )
        )
    ).task  # fmt: skip


async def test_a_mode_b_collector_gets_its_dispatchs_credential_encrypted_to_it_and_signed(
    stack: Stack,
) -> None:
    await stack.router.credential_store.put("tenant-g", "stub:dev-b", json.dumps(VALUE).encode(), "test")
    c = await _mode_b(stack, "col-b", protocol.PROTOCOL_VERSION)
    await _submit(stack, "dev-b")
    answer = await _claim(stack, c, protocol.PROTOCOL_VERSION, claim_seq=2, wait_s=2)
    body = answer.json()
    dispatch_id = body["dispatch_id"]
    assert SECRET not in answer.text  # the gateway, and any proxy, sees only ciphertext
    document = body["credentials"][dispatch_id]
    payload = signed_doc.verify(
        document,
        c.dispatch_keys,
        kind=signed_doc.RELAYED_CREDENTIAL,
        collector_id="col-b",
        now=int(time.time()),
    )
    assert open_for(c.key, "col-b", dispatch_id, payload) == VALUE
    # The envelope stays the answer's last member, byte for byte.
    assert answer.content.endswith(
        b'"envelope":' + json.dumps(body["envelope"], separators=(",", ":")).encode() + b"}"
    )
    async with stack.router.engine.connect() as conn:
        dump = await conn.scalar(text("SELECT string_agg(d::text, ' ') FROM dispatches d"))
        actions = [
            r.action for r in await conn.execute(select(audit_events)) if r.action.startswith("credential.")
        ]
    assert dump and SECRET not in dump
    assert actions == ["credential.put", "credential.deliver"]


async def test_a_mode_b_collector_below_the_relay_floor_takes_no_work_and_the_wait_says_why(
    stack: Stack,
) -> None:
    await _mode_b(stack, "col-b5", 5)
    task = await _submit(stack, "dev-b5")
    got = (await stack.tasks.GetTask(pb.GetTaskRequest(task_id=task.task_id))).task
    assert got.condition == "needs protocol ≥ 6 for relayed_credentials"


async def test_work_leased_under_the_old_vault_mode_is_placed_again_under_the_new_one(stack: Stack) -> None:
    await stack.router.credential_store.put("tenant-g", "stub:dev-m", json.dumps(VALUE).encode(), "test")
    c = await stack.enroll("col-m")
    assert (await stack.publish(c)).status_code == 200
    assert (await _claim(stack, c, protocol.PROTOCOL_VERSION, claim_seq=1)).status_code == 204
    task = await _submit(stack, "dev-m")  # leased to col-m under mode A: no credential relayed
    leased = (await stack.tasks.GetTask(pb.GetTaskRequest(task_id=task.task_id))).task
    first = leased.history[-1].dispatch_id
    assert first
    await Fleet(stack.router).set_vault_mode("col-m", "relayed", "")

    async def attempts() -> dict[str, Any]:
        async with stack.router.engine.connect() as conn:
            query = select(
                dispatches.c.dispatch_id, dispatches.c.state, dispatches.c.relayed_credential
            ).where(dispatches.c.task_id == task.task_id)
            return {r.dispatch_id: r for r in await conn.execute(query)}

    async with asyncio.timeout(10):  # placed again in the background, as after any requeue
        while len(rows := await attempts()) < 2:  # noqa: ASYNC110 - polls PostgreSQL
            await asyncio.sleep(0.05)
    assert rows[first].state == "expired" and rows[first].relayed_credential is None
    again = [r for d, r in rows.items() if d != first]
    assert len(again) == 1 and again[0].state == "leased" and again[0].relayed_credential is not None
