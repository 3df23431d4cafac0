"""A claim parked on the control socket outlasts the router's staleness bound, so the gateway writes
its heartbeat again while the socket answers (gateway/parking/hub.py ``park``), and only then.

Real gateway, router, PostgreSQL and Redis on real sockets (tests/integration/test_gateway_collector.py
``running_stack``), with the refresh and the silence bound shortened to keep the test quick.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from common.redis.keys import LIVE
from gateway.control_socket import CollectorWebSocketProtocol
from gateway.parking import hub
from tests.integration import test_gateway_collector as gw
from tests.integration.test_claim_parking import Counted
from tests.integration.test_gateway_collector import Collector, Stack, running_stack

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

REFRESH_S = 0.3
SILENCE_S = 1.0
SOCKET_HOLD_S = 20.0


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        running.app.state.socket_claim_hold_s = SOCKET_HOLD_S
        running.app.state.parking.beat_refresh_s = REFRESH_S
        yield running


def _claim(c: Collector, seq: int, wait_s: float) -> str:
    body = {"wait_s": wait_s, "session_id": f"s-{c.collector_id}", "capacity": {"stub": 4}, "claim_seq": seq}
    return json.dumps({"v": 1, "id": f"c{seq}", "type": "claim", "body": body})


async def _last_beat(stack: Stack, c: Collector) -> float:
    score = await stack.redis.zscore(LIVE, c.collector_id)
    assert score is not None
    return float(score)


async def _talking(ws: Any, seconds: float) -> None:
    """The collector's side of the socket answers (as it answers the gateway's pings) for a while."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await ws.raw.ping()
        await asyncio.sleep(REFRESH_S)


async def test_a_parked_socket_claim_is_kept_live_while_its_socket_answers(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "HEARD_WITHIN_S", SILENCE_S)
    # The gateway's own keepalive pings (every 20 s) would make the collector answer during the
    # silent phase on a slow machine: here only the test decides when the collector is heard.
    monkeypatch.setattr(CollectorWebSocketProtocol, "send_keepalive_ping", lambda self: None)
    c = await stack.enroll("col-sock-beat")
    assert (await stack.publish(c)).status_code == 200
    counted = Counted(stack)
    async with await gw._ws(stack, c) as ws:
        for seq in (1, 2):  # the first goes to the router; the second, saying the same, parks
            await ws.send(_claim(c, seq, 1.5))
            assert json.loads(await asyncio.wait_for(ws.recv(), 10))["status"] == 204
        assert counted.calls == 1
        await ws.send(_claim(c, 3, SOCKET_HOLD_S))  # parked for the socket's long hold
        await asyncio.sleep(0.5)
        arrived = await _last_beat(stack, c)
        # Answering: the heartbeat moves on while the claim waits (written within the 1 s batch).
        await _talking(ws, 3.0)
        await asyncio.sleep(1.2)
        talked = await _last_beat(stack, c)
        assert talked > arrived + 2.0, (arrived, talked)
        # Silent past the bound: no more heartbeats, the claim still parked.
        await asyncio.sleep(SILENCE_S + 1.2)
        silent = await _last_beat(stack, c)
        await asyncio.sleep(2.0)
        assert await _last_beat(stack, c) == silent
        # Heard again: the heartbeat resumes.
        await _talking(ws, 1.5)
        await asyncio.sleep(1.2)
        assert await _last_beat(stack, c) > silent + 1.0
        assert counted.calls == 1  # all of it in the gateway


async def test_a_socket_claim_waits_for_the_socket_hold_and_a_long_poll_for_its_own(stack: Stack) -> None:
    stack.app.state.socket_claim_hold_s = socket_hold = gw.HOLD_S + 2
    c = await stack.enroll("col-sock-hold")
    async with await gw._ws(stack, c) as ws:
        started = time.monotonic()
        await ws.send(_claim(c, 1, 600))  # asks for more than either hold
        answer = json.loads(await asyncio.wait_for(ws.recv(), socket_hold + 20))
        assert answer["status"] == 204
        assert float(answer["headers"]["X-Versus-Claim-Hold"]) == socket_hold
        assert time.monotonic() - started >= socket_hold - 0.2
    reply = await stack.post("/claim", {"wait_s": 600, "claim_seq": 2}, c)
    assert (reply.status_code, float(reply.headers["X-Versus-Claim-Hold"])) == (204, gw.HOLD_S)
