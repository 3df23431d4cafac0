"""Direct attachment and tunnel protocol 2 over real sockets: the ticket, the attach socket's
frames and refusals, the resume of a dropped collector socket on a real gateway."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from prometheus_client import REGISTRY

from common.tunnel import frames
from common.tunnel.attach import attach, end_reason
from tests.integration import test_gateway_collector as gw
from tests.integration.test_tunnel_socket import Platform, _live, _offered_session
from tests.support.spans import recorded_spans

pytestmark = pytest.mark.timeout(60)
stack = gw.stack


async def _dial_v2(stack: gw.Stack, c: gw.Collector, session_id: str, v: str = "2") -> Any:
    path = gw.API + f"/tunnel?session={session_id}&v={v}"
    url = stack.url.replace("http://", "ws://") + path
    return await websockets.connect(url, additional_headers=c.headers_for("GET", path), open_timeout=5)


async def _from_gateway(ws: Any) -> bytes | str:
    """The gateway's next frame on the collector's socket, past its acknowledgements (sent now and
    then, whenever the platform took bytes: their place among the data frames is not fixed)."""
    while True:
        frame = await asyncio.wait_for(ws.recv(), 5)
        if not (isinstance(frame, str) and frame.startswith("ack:")):
            return frame  # type: ignore[no-any-return]


async def _ready(stack: gw.Stack, name: str) -> tuple[gw.Collector, Platform, str, Any]:
    """A direct session offered to ``name``, its protocol-2 socket open and resumed from 0."""
    c = await _live(stack, name)
    platform = Platform(stack.grpc_address, name, stack.platform_token, direct=True)
    session_id = await _offered_session(stack, c, platform)
    ws = await _dial_v2(stack, c, session_id)
    assert ws.response.headers["x-versus-tunnel-protocol"] == "2"
    await ws.send(frames.resume(0))
    assert await asyncio.wait_for(ws.recv(), 5) == frames.resume(0)
    return c, platform, session_id, ws


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_direct_session_moves_bytes_without_the_router(stack: gw.Stack) -> None:
    to_device = _sample("versus_gateway_tunnel_bytes_total", direction="to_device")
    done = _sample("versus_gateway_tunnel_sessions_ended_total", reason="done")
    _, platform, session_id, ws = await _ready(stack, "att-1")
    supervisor = stack.app.state.tunnels.sessions[session_id].supervisor
    try:
        ready = (await platform.next()).ready
        assert (ready.session_id, ready.attach_url.startswith("ws://")) == (session_id, True)
        assert ready.ticket.startswith(session_id + ".")
        attached = await attach(ready.attach_url, ready.ticket)
        big = bytes(range(256)) * 4096  # 1 MiB: one frame each way
        await attached.send(big)
        assert await _from_gateway(ws) == big
        await ws.send(b"from the device")
        assert await asyncio.wait_for(attached.recv(), 5) == b"from the device"
        # Half-closes both ways; the collector acknowledges what it took, eof included.
        await attached.send(frames.EOF)
        assert await _from_gateway(ws) == frames.EOF
        await ws.send(frames.ack(len(big) + 1))
        await ws.send(frames.EOF)
        assert await asyncio.wait_for(attached.recv(), 5) == frames.EOF
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(attached.recv(), 5)
        assert end_reason(attached) == "done"
        # The gateway's metrics saw the session's bytes and its end.
        assert _sample("versus_gateway_tunnel_bytes_total", direction="to_device") - to_device == len(big)
        # The session's supervisor counts its end once it has forgotten it (a moment later).
        await asyncio.wait_for(supervisor, 5)
        assert session_id not in stack.app.state.tunnels.sessions
        assert _sample("versus_gateway_tunnel_sessions_ended_total", reason="done") == done + 1
    finally:
        await ws.close()
        await platform.close()


async def test_a_traced_session_is_a_gateway_span_under_the_routers_open_tunnel(stack: gw.Stack) -> None:
    with recorded_spans() as spans:
        _, platform, session_id, ws = await _ready(stack, "att-traced")
        supervisor = stack.app.state.tunnels.sessions[session_id].supervisor
        try:
            ready = (await platform.next()).ready
            attached = await attach(ready.attach_url, ready.ticket)
            await attached.send(frames.EOF)
            assert await _from_gateway(ws) == frames.EOF
            await ws.send(frames.ack(1))
            await ws.send(frames.EOF)
            assert await asyncio.wait_for(attached.recv(), 5) == frames.EOF
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(attached.recv(), 5)
            await asyncio.wait_for(supervisor, 5)
        finally:
            await ws.close()
            await platform.close()
        finished = {s.name: s for s in spans.get_finished_spans()}
    opened = finished["versus.router.v1.TunnelService/OpenTunnel"]
    held = finished["versus.gateway.tunnel"]
    assert held.parent is not None and held.parent.span_id == opened.context.span_id
    assert held.context.trace_id == opened.context.trace_id
    assert (held.attributes or {})["versus.tunnel.reason"] == "done"
    assert (held.attributes or {})["versus.session_id"] == session_id


async def test_a_ticket_is_good_once_and_only_for_its_session(stack: gw.Stack) -> None:
    _, platform, session_id, ws = await _ready(stack, "att-2")
    try:
        ready = (await platform.next()).ready
        forged = session_id + ".not-the-secret"
        for ticket, url in ((forged, ready.attach_url), ("garbage", ready.attach_url)):
            with pytest.raises(websockets.InvalidStatus) as refused:
                await attach(url, ticket)
            assert refused.value.response.status_code == 401
            assert json.loads(refused.value.response.body)["error"]["code"] == "tunnel_ticket_invalid"
        with pytest.raises(websockets.InvalidStatus) as elsewhere:
            await attach(ready.attach_url.replace("/v1/tunnel", "/v1/other"), ready.ticket)
        assert elsewhere.value.response.status_code == 404
        attached = await attach(ready.attach_url, ready.ticket)
        with pytest.raises(websockets.InvalidStatus) as again:
            await attach(ready.attach_url, ready.ticket)
        assert again.value.response.status_code == 401  # used
        await attached.close()
    finally:
        await ws.close()
        await platform.close()


@pytest.mark.parametrize(
    ("frame", "reason"), [("hello", "tunnel_frame_invalid"), (b"x" * (1024 * 1024 + 1), "gateway_gone")]
)
async def test_a_bad_frame_from_the_platform_ends_the_session(
    stack: gw.Stack, frame: str | bytes, reason: str
) -> None:
    """Text other than eof ends the session with its code; a frame over 1 MiB is refused by the
    socket itself (1009, which carries no session reason)."""
    _, platform, _, ws = await _ready(stack, f"att-bad-{len(frame)}")
    try:
        ready = (await platform.next()).ready
        attached = await attach(ready.attach_url, ready.ticket)
        await attached.send(frame)
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(attached.recv(), 5)
        assert end_reason(attached) == reason
    finally:
        await ws.close()
        await platform.close()


async def test_a_dropped_collector_socket_resumes_where_it_stopped(stack: gw.Stack) -> None:
    c, platform, session_id, ws = await _ready(stack, "att-resume")
    try:
        ready = (await platform.next()).ready
        attached = await attach(ready.attach_url, ready.ticket)
        await attached.send(b"a" * 1000)
        assert await _from_gateway(ws) == b"a" * 1000
        await ws.send(b"d" * 10)
        assert await asyncio.wait_for(attached.recv(), 5) == b"d" * 10
        # The socket drops without a close frame (the transport aborted, as on a reset), before
        # the collector acknowledged the 1,000 bytes; the platform goes on writing meanwhile.
        ws.transport.abort()
        await attached.send(b"b" * 500)
        again = await _dial_v2(stack, c, session_id)
        await again.send(frames.resume(1000))  # the collector has the first 1,000 bytes
        assert await asyncio.wait_for(again.recv(), 5) == frames.resume(10)  # the gateway, its 10
        assert await _from_gateway(again) == b"b" * 500  # only what is missing
        await again.send(b"e" * 3)
        assert await asyncio.wait_for(attached.recv(), 5) == b"e" * 3
        await again.close()
    finally:
        await platform.close()


async def test_a_version_that_is_not_one_is_refused(stack: gw.Stack) -> None:
    c = await _live(stack, "att-v")
    platform = Platform(stack.grpc_address, "att-v", stack.platform_token, direct=True)
    try:
        session_id = await _offered_session(stack, c, platform)
        for bad in ("0", "two"):
            with pytest.raises(websockets.InvalidStatus) as refused:
                await _dial_v2(stack, c, session_id, v=bad)
            assert refused.value.response.status_code == 400
            assert json.loads(refused.value.response.body)["error"]["code"] == "tunnel_version_invalid"
    finally:
        await platform.close()
