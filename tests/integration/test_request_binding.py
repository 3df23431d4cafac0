"""Bearer tokens bound to one request and accepted once: what an intercepting proxy can no longer do.

Each test plays the proxy: it holds a request the collector signed and tries to
move it, alter it or send it again; the gateway must refuse with a stable code
and PostgreSQL must show that nothing changed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy import select

from common.db.schema import dispatches
from common.redis.client import create_async as create_redis
from tests.integration import test_gateway_collector as gw
from tests.support.collector_auth import bound_token, signed_frame, signed_report

API = gw.API
stack = gw.stack  # the same real enrollment + router + gateway stack


async def _send(stack: gw.Stack, method: str, path: str, token: str, body: bytes = b"") -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
        return await client.request(method, path, headers=headers, content=body or None)


def _code(reply: httpx.Response) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


async def _claimed(stack: gw.Stack, name: str, key: str) -> tuple[gw.Collector, str]:
    c = await stack.enroll(name)
    await stack.publish(c)
    assert (await stack.post("/claim", {"wait_s": 0}, c)).status_code == 204
    await stack.submit(key)
    claimed = await stack.post("/claim", {"claim_seq": 1}, c)
    assert claimed.status_code == 200, claimed.text
    return c, str(claimed.json()["dispatch_id"])


async def _dispatch_state(stack: gw.Stack, dispatch_id: str) -> str:
    async with stack.service.store.engine.connect() as conn:
        state = await conn.scalar(select(dispatches.c.state).where(dispatches.c.dispatch_id == dispatch_id))
    return str(state)


async def test_a_report_can_be_neither_replayed_nor_altered(stack: gw.Stack) -> None:
    c, dispatch_id = await _claimed(stack, "col-bind-r", "t-bind-r")
    signed = signed_report(
        c.key, c.collector_id, {"task_id": dispatch_id, "outcome": "failed", "error_code": "x"}
    )
    failed = json.dumps(signed).encode()
    success = json.dumps({**signed, "outcome": "success", "error_code": ""}).encode()
    token = bound_token(c.key, c.collector_id, "POST", API + "/report", failed)
    # The proxy changes the outcome under the collector's token.
    assert _code(await _send(stack, "POST", API + "/report", token, success)) == (401, "bearer_wrong_body")
    assert await _dispatch_state(stack, dispatch_id) == "dispatched"
    # ...or moves the token to another endpoint, or another method.
    assert _code(await _send(stack, "POST", API + "/claim", token, failed)) == (401, "bearer_wrong_path")
    get_token = bound_token(c.key, c.collector_id, "GET", API + "/report")
    assert _code(await _send(stack, "POST", API + "/report", get_token)) == (401, "bearer_wrong_method")
    # The genuine report goes through once; the same request again is a replay.
    fresh = bound_token(c.key, c.collector_id, "POST", API + "/report", failed)
    assert (await _send(stack, "POST", API + "/report", fresh, failed)).status_code == 200
    assert _code(await _send(stack, "POST", API + "/report", fresh, failed)) == (401, "bearer_replayed")
    assert await _dispatch_state(stack, dispatch_id) == "failed"


async def test_a_replayed_claim_is_refused_and_takes_no_task(stack: gw.Stack) -> None:
    c = await stack.enroll("col-bind-c")
    await stack.publish(c)
    body = json.dumps({"wait_s": 0}).encode()
    token = bound_token(c.key, c.collector_id, "POST", API + "/claim", body)
    assert (await _send(stack, "POST", API + "/claim", token, body)).status_code == 204
    await stack.submit("t-bind-c")
    assert _code(await _send(stack, "POST", API + "/claim", token, body)) == (401, "bearer_replayed")
    async with stack.service.store.engine.connect() as conn:
        query = select(dispatches.c.state).where(dispatches.c.collector_id == c.collector_id)
        states = (await conn.scalars(query)).all()
    assert "dispatched" not in states, states  # the task waits for the collector's own next claim


async def test_a_token_without_a_request_binding_is_refused(stack: gw.Stack) -> None:
    import time

    import jwt

    c = await stack.enroll("col-bind-u")
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": c.collector_id, "sub": c.collector_id, "aud": "versus-collector-gateway",
        "iat": now, "exp": now + 60, "jti": "unbound-0001",
    }  # fmt: skip
    token = jwt.encode(claims, c.key, algorithm="ES256")
    assert _code(await _send(stack, "POST", API + "/claim", token, b"{}")) == (401, "bearer_unbound")


async def test_without_the_replay_cache_state_changes_are_refused_and_reads_go_ahead(stack: gw.Stack) -> None:
    c, dispatch_id = await _claimed(stack, "col-bind-d", "t-bind-d")
    connections = stack.app.state.connections
    working = connections.redis
    # A real client for a Redis that is not there: every command fails to connect.
    connections.redis = create_redis("redis://127.0.0.1:1/0")
    try:
        report = json.dumps({"task_id": dispatch_id, "outcome": "success"}).encode()
        token = bound_token(c.key, c.collector_id, "POST", API + "/report", report)
        assert _code(await _send(stack, "POST", API + "/report", token, report)) == (
            503,
            "replay_check_unavailable",
        )
        status = bound_token(c.key, c.collector_id, "GET", API + "/enrollment")
        assert (await _send(stack, "GET", API + "/enrollment", status)).status_code == 200
    finally:
        await connections.redis.aclose()
        connections.redis = working
    assert await _dispatch_state(stack, dispatch_id) == "dispatched"


async def test_control_frames_are_each_bound_and_accepted_once(stack: gw.Stack) -> None:
    c, dispatch_id = await _claimed(stack, "col-bind-w", "t-bind-w")
    report = {"task_id": dispatch_id, "outcome": "success", "result_b64": ""}

    async def answer(ws: Any, frame: dict[str, Any]) -> tuple[int, str]:
        await ws.raw.send(json.dumps(frame))
        reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
        body = reply["body"] or {}
        return reply["status"], body.get("error", {}).get("code", "")

    async with await gw._ws(stack, c) as ws:
        unsigned = {"v": 1, "id": "1", "type": "report", "body": report}
        assert await answer(ws, unsigned) == (401, "bearer_missing")
        signed = json.loads(signed_frame(c.key, c.collector_id, json.dumps(unsigned)))
        altered = {**signed, "id": "2", "body": {**report, "outcome": "failed"}}
        assert await answer(ws, altered) == (401, "bearer_wrong_body")
        as_claim = {**signed, "id": "3", "type": "claim", "body": {"wait_s": 0}}
        assert await answer(ws, as_claim) == (401, "bearer_wrong_path")
        assert await stack.redis.ping()
        assert await _dispatch_state(stack, dispatch_id) == "dispatched"
        assert (await answer(ws, {**signed, "id": "4"}))[0] == 200
        assert await answer(ws, {**signed, "id": "5"}) == (401, "bearer_replayed")
        # The socket stays usable for the collector's own, correctly signed frames.
        await ws.send(json.dumps({"v": 1, "id": "6", "type": "claim", "body": {"wait_s": 0}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["status"] == 204
    assert await _dispatch_state(stack, dispatch_id) == "success"
    # A frame's token is for the socket only: over HTTPS it is the wrong method.
    frame_token = json.loads(signed_frame(c.key, c.collector_id, json.dumps({"type": "claim", "body": {}})))[
        "auth"
    ]
    assert _code(await _send(stack, "POST", API + "/claim", frame_token, b"{}")) == (
        401,
        "bearer_wrong_method",
    )


@pytest.mark.parametrize("path", ["/tunnel?session=tun-other", "/control"])
async def test_a_socket_token_opens_only_the_socket_it_names(stack: gw.Stack, path: str) -> None:
    import websockets

    c = await stack.enroll(f"col-bind-s{len(path)}")
    token = bound_token(c.key, c.collector_id, "GET", API + "/tunnel?session=tun-mine")
    url = stack.url.replace("http://", "ws://") + API + path
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websockets.connect(url, additional_headers={"Authorization": "Bearer " + token}, open_timeout=5)
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["error"]["code"] == "bearer_wrong_path"


async def test_the_router_records_only_what_the_collector_signed(stack: gw.Stack) -> None:
    # Whatever sits between the collector and the router (here: a caller holding the gateway's own
    # service token) cannot invent or change an outcome: the router checks the collector's signature
    # against its key in PostgreSQL, records the refusal, and keeps the signature with the dispatch.
    from sqlalchemy import func
    from versus.router.v1 import collector_bridge_pb2 as bpb
    from versus.router.v1 import collector_bridge_pb2_grpc

    from common.access.rbac import Role
    from common.db.schema import audit_events
    from common.grpc.client import aio_channel
    from tests.support.access import mint

    c, dispatch_id = await _claimed(stack, "col-sig", "t-sig")
    signed = signed_report(
        c.key, c.collector_id, {"task_id": dispatch_id, "outcome": "failed", "error_code": "x"}
    )
    async with aio_channel(stack.grpc_address, await mint(stack.router.engine, Role.SERVICE)) as channel:
        bridge = collector_bridge_pb2_grpc.CollectorBridgeServiceStub(channel)

        async def report(outcome: bpb.ReportOutcome.ValueType, error_code: str, signature: str) -> str:
            request = bpb.ReportRequest(
                collector_id=c.collector_id, task_id=dispatch_id, outcome=outcome, error_code=error_code,
                signature=signature,
            )  # fmt: skip
            try:
                await bridge.Report(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                pairs: Any = exc.trailing_metadata() or ()
                return str(dict(pairs).get("versus-error-code", exc.code()))
            return "ok"

        assert await report(bpb.REPORT_OUTCOME_SUCCESS, "", "") == "report_unsigned"
        forged = await report(bpb.REPORT_OUTCOME_SUCCESS, "", signed["signature"])
        assert forged == "report_signature_invalid"
        assert await _dispatch_state(stack, dispatch_id) == "dispatched"
        assert await report(bpb.REPORT_OUTCOME_FAILED, "x", signed["signature"]) == "ok"
    async with stack.service.store.engine.connect() as conn:
        kept = await conn.scalar(
            select(dispatches.c.report_signature).where(dispatches.c.dispatch_id == dispatch_id)
        )
        audited = await conn.scalar(
            select(func.count())
            .select_from(audit_events)
            .where(audit_events.c.action == "report.bad_signature")
        )
    assert await _dispatch_state(stack, dispatch_id) == "failed"
    assert kept == signed["signature"] and audited == 2
