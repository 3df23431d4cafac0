"""Protocol versions over real sockets: negotiation on claims, refusals that say why, and bye."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from sqlalchemy import select

from collector.client import GatewayClient
from collector.gateway_errors import GatewayRefused
from collector.request_auth import frame_body
from common import protocol
from common.db.schema import dispatches, tasks
from router.core.fleet_state import SessionState
from router.fleet.operations import Fleet
from tests.integration.test_gateway_collector import API, Collector, Stack, _ws, running_stack

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

NEWEST = protocol.PROTOCOL_VERSION
OFFER = {"min": 1, "max": NEWEST}


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        yield running


async def _session(stack: Stack, collector_id: str) -> Any:
    return (await Fleet(stack.router).get(collector_id)).session


async def _claim(stack: Stack, c: Collector, version: int | None = None, **body: Any) -> Any:
    headers = {} if version is None else {protocol.HEADER: str(version)}
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        return await client.post(API + "/claim", json={"wait_s": 0, **body}, auth=c.auth, headers=headers)


async def test_a_claim_settles_the_highest_version_both_speak_and_fleet_views_show_it(stack: Stack) -> None:
    old = await stack.enroll("col-v1")
    new = await stack.enroll("col-v2")
    # A collector from before negotiation: no header, no offer. It is answered in 1 and settles 1.
    answer = await _claim(stack, old, session_id="s-old")
    assert (answer.status_code, answer.headers[protocol.HEADER]) == (204, "1")
    assert (await _session(stack, "col-v1")).protocol_version == 1
    # A current one offers its range in a version-1 message (nothing is settled yet) and settles 2.
    answer = await _claim(stack, new, 1, session_id="s-new", protocol=OFFER)
    assert (answer.status_code, answer.headers[protocol.HEADER]) == (204, str(NEWEST))
    assert (await _session(stack, "col-v2")).protocol_version == NEWEST
    # A newer one than this gateway settles on the newest this gateway speaks.
    answer = await _claim(stack, new, NEWEST, session_id="s-new", protocol={"min": 1, "max": NEWEST + 3})
    assert answer.headers[protocol.HEADER] == str(NEWEST)
    # Over the socket: the answer frame is written in the frame's version and names the settled one.
    async with await _ws(stack, new) as ws:
        claim = {"wait_s": 0, "session_id": "s-new", "protocol": OFFER}
        await ws.send(json.dumps({"v": 1, "id": "c1", "type": "claim", "body": claim}))
        frame = json.loads(await ws.recv())
        assert (frame["v"], frame["status"], frame["headers"][protocol.HEADER]) == (1, 204, str(NEWEST))
        # Written in the settled version (from 7 the body travels as its JSON text).
        written = frame_body(NEWEST, claim)[0]
        await ws.send(json.dumps({"v": NEWEST, "id": "c2", "type": "claim", "body": written}))
        assert json.loads(await ws.recv())["v"] == NEWEST


async def test_versions_outside_the_range_are_refused_with_the_range_spoken_here(stack: Stack) -> None:
    c = await stack.enroll("col-future")
    expected = {"min": protocol.MIN_PROTOCOL_VERSION, "max": NEWEST}
    # A collector whose oldest version is newer than this gateway's newest.
    answer = await _claim(stack, c, 1, session_id="s-f", protocol={"min": NEWEST + 1, "max": NEWEST + 2})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["details"]) == (400, "version_unsupported", expected)
    # A request written in a version nobody speaks yet.
    answer = await _claim(stack, c, NEWEST + 1, session_id="s-f")
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "version_unsupported")
    # Over the socket: the refusal is a frame that says why, then the socket closes with that code.
    async with await _ws(stack, c) as ws:
        await ws.send(json.dumps({"v": NEWEST + 1, "id": "x1", "type": "claim", "body": {}}))
        refusal = json.loads(await ws.recv())
        assert (refusal["id"], refusal["status"]) == ("x1", 400)
        assert refusal["body"]["error"]["code"] == "version_unsupported"
        assert refusal["body"]["error"]["details"] == expected
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4400, "version_unsupported")


async def test_bye_takes_the_collector_offline_and_its_unclaimed_work_goes_elsewhere(stack: Stack) -> None:
    leaving, staying = await stack.enroll("col-bye"), await stack.enroll("col-stays")
    await stack.publish(leaving)
    assert (await _claim(stack, leaving, 1, session_id="s-bye", protocol=OFFER)).status_code == 204
    submitted = await stack.submit("bye-1")
    async with stack.router.engine.connect() as conn:
        holder = await conn.scalar(
            select(dispatches.c.collector_id).where(dispatches.c.task_id == submitted.task.task_id)
        )
    assert holder == "col-bye"
    # bye exists from protocol 2: a message written in 1 cannot carry it.
    too_old = await stack.post("/bye", {"session_id": "s-bye"}, leaving)
    assert (too_old.status_code, too_old.json()["error"]["code"]) == (400, "version_unsupported")
    # Not the current session: nothing changes.
    other = await _post_bye(stack, leaving, "s-other")
    assert other == {"current": False, "requeued": 0}
    said = await _post_bye(stack, leaving, "s-bye", reason="upgrade")
    assert said == {"current": True, "requeued": 1}
    session = await _session(stack, "col-bye")
    assert (session.state, session.goodbye_reason) == (SessionState.OFFLINE, "upgrade")
    async with stack.router.engine.connect() as conn:
        state = await conn.scalar(select(tasks.c.state).where(tasks.c.task_id == submitted.task.task_id))
    assert state == "queued"  # back in the queue at once, not after the lease ran out
    # The work goes to a collector that is still there, never back to the one that left.
    await stack.publish(staying)
    assert (await _claim(stack, staying, 1, session_id="s-st", protocol=OFFER)).status_code in (200, 204)

    async def holders() -> set[str]:
        async with stack.router.engine.connect() as conn:
            live = select(dispatches.c.collector_id).where(
                dispatches.c.task_id == submitted.task.task_id, dispatches.c.state != "expired"
            )
            return set((await conn.execute(live)).scalars())

    for _ in range(100):  # placed again in the background once the staying collector is live
        if await holders():
            break
        await asyncio.sleep(0.05)
    assert await holders() == {"col-stays"}
    # Claiming again brings the collector back.
    assert (await _claim(stack, leaving, 1, session_id="s-bye2", protocol=OFFER)).status_code == 204
    assert (await _session(stack, "col-bye")).state is SessionState.ACTIVE


async def _post_bye(stack: Stack, c: Collector, session_id: str, reason: str = "shutdown") -> Any:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        answer = await client.post(
            API + "/bye",
            json={"session_id": session_id, "reason": reason},
            auth=c.auth,
            headers={protocol.HEADER: "2"},
        )
    assert answer.status_code == 200, answer.text
    assert answer.headers[protocol.HEADER] == "2"
    return answer.json()


async def test_the_reference_client_settles_falls_back_when_refused_and_says_goodbye(stack: Stack) -> None:
    c = await stack.enroll("col-client")
    client = GatewayClient(
        stack.url, ssl.create_default_context(), c.key, c.collector_id, prefer_websocket=False
    )
    try:
        # Before any claim it writes version 1 and has nothing to say goodbye with.
        assert client.protocol == 1
        assert await client.bye("s-c", "shutdown") is False
        await client.claim({"wait_s": 0, "session_id": "s-c"}, 0)
        assert client.protocol == NEWEST
        # A gateway that no longer speaks the settled version (rolled back, say): refused, and the
        # client writes version 1 again until its next claim settles anew.
        client.protocol = NEWEST + 1
        with pytest.raises(GatewayRefused) as refused:
            await client.claim({"wait_s": 0, "session_id": "s-c"}, 0)
        assert refused.value.code == "version_unsupported"
        assert client.protocol == 1
        await client.claim({"wait_s": 0, "session_id": "s-c"}, 0)
        assert client.protocol == NEWEST
        assert await client.bye("s-c", "shutdown") is True
        assert (await _session(stack, "col-client")).state is SessionState.OFFLINE
    finally:
        await client.close()
