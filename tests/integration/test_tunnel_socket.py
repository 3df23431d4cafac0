"""The gateway's tunnel socket over real sockets: pairing, relaying, refusals and teardown."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets
from sqlalchemy import update
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc

from common.db.schema import collectors
from common.grpc.client import STREAM_WINDOW_BYTES, aio_channel
from common.tunnel import attach as tunnel_attach
from common.tunnel import end as tunnel_end
from common.tunnel import frames
from gateway.tunnels import attach
from tests.integration import test_gateway_collector as gw

pytestmark = pytest.mark.timeout(60)
stack = gw.stack  # the same real enrollment + router + gateway stack


class Platform:
    """The platform's end of one tunnel: requests go in through a queue, replies are collected."""

    def __init__(self, address: str, collector_id: str, token: str, direct: bool = False):
        self.channel = aio_channel(address, token)
        self.outbox: asyncio.Queue[pb.OpenTunnelRequest | None] = asyncio.Queue()
        opened = pb.TunnelOpen(host="10.0.0.7", port=22, collector_id=collector_id, direct=direct)
        self.outbox.put_nowait(pb.OpenTunnelRequest(open=opened))
        self.replies: asyncio.Queue[pb.OpenTunnelResponse] = asyncio.Queue()
        self.sent = 0  # bytes the gRPC stream has taken from the outbox
        self.task = asyncio.create_task(self._run())

    async def _requests(self) -> AsyncIterator[pb.OpenTunnelRequest]:
        while (item := await self.outbox.get()) is not None:
            self.sent += len(item.data)
            yield item

    async def _run(self) -> None:
        async for reply in tunnel_pb2_grpc.TunnelServiceStub(self.channel).OpenTunnel(self._requests()):
            await self.replies.put(reply)

    async def next(self) -> pb.OpenTunnelResponse:
        return await asyncio.wait_for(self.replies.get(), 10)

    async def close(self) -> None:
        self.outbox.put_nowait(None)
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.channel.close(None)


async def _live(stack: gw.Stack, name: str) -> gw.Collector:
    c = await stack.enroll(name)
    assert (await stack.post("/claim", {"wait_s": 0}, c)).status_code == 204
    return c


# How long a test waits for the platform's offer to reach its collector's claims.
OFFER_DEADLINE_S = 30.0


async def _offered_session(stack: gw.Stack, c: gw.Collector, platform: Platform) -> str:
    """The session the platform's OpenTunnel offered, claimed as a collector does: again after
    an empty answer. The platform's call runs beside the claim, and a claim the gateway's hold
    (gw.HOLD_S) ended before the router made the offer rightly answers 204; the offer comes with
    the next one. A failed OpenTunnel fails the test with its own error."""
    deadline = asyncio.get_running_loop().time() + OFFER_DEADLINE_S
    while True:
        if platform.task.done():
            platform.task.result()  # the OpenTunnel call's error, if it ended with one
            raise AssertionError("OpenTunnel ended before the collector was offered its session")
        claimed = await stack.post("/claim", {"wait_s": gw.HOLD_S}, c)
        if claimed.status_code != 204:
            break
        assert asyncio.get_running_loop().time() < deadline, "no tunnel offer reached the claims"
    assert claimed.status_code == 200, claimed.text
    [offer] = claimed.json()["offers"]
    assert (offer["type"], offer["host"], offer["port"]) == ("tunnel", "10.0.0.7", 22)
    session_id: str = offer["session_id"]
    return session_id


async def _dial(stack: gw.Stack, c: gw.Collector, session_id: str, **options: Any) -> Any:
    path = gw.API + f"/tunnel?session={session_id}"
    url = stack.url.replace("http://", "ws://") + path
    return await websockets.connect(
        url, additional_headers=c.headers_for("GET", path), open_timeout=5, **options
    )


async def test_bytes_flow_both_ways_and_half_close_is_carried(stack: gw.Stack) -> None:
    c = await _live(stack, "tun-1")
    platform = Platform(stack.grpc_address, "tun-1", stack.platform_token)
    try:
        session_id = await _offered_session(stack, c, platform)
        async with await _dial(stack, c, session_id) as ws:
            ready = await platform.next()
            assert (ready.ready.session_id, ready.ready.collector_id) == (session_id, "tun-1")
            await platform.outbox.put(pb.OpenTunnelRequest(data=b"SSH-2.0-platform\r\n"))
            assert await asyncio.wait_for(ws.recv(), 5) == b"SSH-2.0-platform\r\n"
            await ws.send(b"SSH-2.0-device\r\n")
            assert (await platform.next()).data == b"SSH-2.0-device\r\n"
            await ws.send("eof")
            assert (await platform.next()).close_write
            await platform.outbox.put(pb.OpenTunnelRequest(close_write=True))
            assert await asyncio.wait_for(ws.recv(), 5) == "eof"
            assert (await platform.next()).closed.reason == "done"
    finally:
        await platform.close()


async def test_a_platform_message_larger_than_a_frame_is_carried_in_frames(stack: gw.Stack) -> None:
    """gRPC takes messages up to 16 MiB from a platform that does not attach itself; the router
    carries one in frames the attach socket takes, and the collector's protocol-1 socket in 64 KiB."""
    c = await _live(stack, "tun-large")
    platform = Platform(stack.grpc_address, "tun-large", stack.platform_token)
    payload = os.urandom(3 * 1024 * 1024 + 5)
    try:
        session_id = await _offered_session(stack, c, platform)
        async with await _dial(stack, c, session_id) as ws:
            await platform.next()  # ready
            await platform.outbox.put(pb.OpenTunnelRequest(data=payload))
            received = bytearray()
            while len(received) < len(payload):
                frame = await asyncio.wait_for(ws.recv(), 10)
                assert len(frame) <= frames.MAX_FRAME_BYTES[frames.V1]
                received += frame
            assert bytes(received) == payload
    finally:
        await platform.close()


async def test_strangers_and_unknown_sessions_are_refused(stack: gw.Stack) -> None:
    owner = await _live(stack, "tun-owner")
    stranger = await _live(stack, "tun-stranger")
    platform = Platform(stack.grpc_address, "tun-owner", stack.platform_token)
    try:
        session_id = await _offered_session(stack, owner, platform)
        for who, session in ((stranger, session_id), (owner, "tun-0000")):
            with pytest.raises(websockets.InvalidStatus) as refused:
                await _dial(stack, who, session)
            assert refused.value.response.status_code == 403
            assert json.loads(refused.value.response.body)["error"]["code"] == "tunnel_not_yours"
        url = stack.url.replace("http://", "ws://") + gw.API + f"/tunnel?session={session_id}"
        headers = {
            **owner.headers_for("GET", gw.API + f"/tunnel?session={session_id}"),
            "Origin": "https://evil.example",
        }
        with pytest.raises(websockets.InvalidStatus) as browser:
            await websockets.connect(url, additional_headers=headers, open_timeout=5)
        assert browser.value.response.status_code == 403
        # The owner can still take its session: the refusals changed nothing.
        async with await _dial(stack, owner, session_id):
            assert (await platform.next()).ready.session_id == session_id
    finally:
        await platform.close()


async def test_an_oversized_frame_ends_the_tunnel_with_1009(stack: gw.Stack) -> None:
    c = await _live(stack, "tun-big")
    platform = Platform(stack.grpc_address, "tun-big", stack.platform_token)
    try:
        async with await _dial(stack, c, await _offered_session(stack, c, platform)) as ws:
            await platform.next()  # ready
            await ws.send(b"x" * (64 * 1024 + 1))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1009, "frame_too_large")
        assert (await platform.next()).closed.reason == "frame_too_large"
    finally:
        await platform.close()


async def test_revoking_the_collector_tears_down_its_open_tunnel(stack: gw.Stack) -> None:
    c = await _live(stack, "tun-rev")
    platform = Platform(stack.grpc_address, "tun-rev", stack.platform_token)
    try:
        async with await _dial(stack, c, await _offered_session(stack, c, platform)) as ws:
            await platform.next()  # ready
            async with stack.service.store.engine.begin() as conn:
                await conn.execute(
                    update(collectors).where(collectors.c.collector_id == "tun-rev").values(status="revoked")
                )
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5 + gw.REVOCATION_CHECK_S)
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4401, "collector_revoked")
        assert (await platform.next()).closed.reason == "collector_gone"
    finally:
        await platform.close()


def _kernel_send_buffer_max() -> int:
    """The most the kernel lets one TCP socket's send buffer grow to (autotuning's ceiling)."""
    with open("/proc/sys/net/ipv4/tcp_wmem") as f:
        return int(f.read().split()[2])


# What the test's collector itself may hold: its pinned socket receive buffer (the kernel doubles
# the value set), what one read of the event loop takes at once (asyncio reads up to 256 KiB), and
# the frames its WebSocket client queues before it stops reading the socket.
COLLECTOR_RCVBUF = 64 * 1024
COLLECTOR_QUEUE_FRAMES = 4
LOOP_READ_BYTES = 256 * 1024
# websockets' default high-water mark of a connection's write buffer.
WS_WRITE_LIMIT = 32 * 1024


def _stalled_session_bound() -> int:
    """The most a session may take from the platform while its collector reads nothing.

    Every buffer on the path, each with its own bound: the gRPC hop from the platform to the
    router (at most two fixed windows: the receiver's, which gRPC widens by the message being
    read, and what the sender's transport has taken); the router's socket to the gateway's attach
    listener (its write buffer and a frame in hand, the kernel's send buffer, the gateway's pinned
    receive buffer, which the kernel doubles, and the frames the gateway's socket queues); the
    gateway's window toward the collector (on protocol 1: bytes not yet written to its socket);
    the gateway's socket to the collector (its transport's write buffer, which takes one more
    frame when just under its limit, and the kernel's send buffer); a chunk in hand in each
    relaying loop; the test collector's own buffers. Nothing grows with what the platform writes."""
    chunk = frames.MAX_FRAME_BYTES[frames.V1]
    grpc_hop = 2 * STREAM_WINDOW_BYTES
    attach_hop = (
        WS_WRITE_LIMIT + chunk + _kernel_send_buffer_max()
        + 2 * attach.ATTACH_RCVBUF_BYTES + tunnel_attach.MAX_QUEUE_FRAMES * chunk
    )  # fmt: skip
    gateway_window = tunnel_end.WINDOW_BYTES
    gateway_socket = 2 * chunk + _kernel_send_buffer_max()
    in_hand = 4 * chunk
    collector = 2 * COLLECTOR_RCVBUF + LOOP_READ_BYTES + COLLECTOR_QUEUE_FRAMES * chunk
    return grpc_hop + attach_hop + gateway_window + gateway_socket + in_hand + collector


async def _until_stalled(platform: Platform) -> None:
    """Return once the platform's writes have not moved for a second (30 s at most)."""
    async with asyncio.timeout(30):
        last, still = -1, 0
        while still < 4:
            await asyncio.sleep(0.25)
            last, still = platform.sent, still + 1 if platform.sent == last else 0


async def test_a_collector_that_stops_reading_stalls_the_platform_instead_of_buffering(
    stack: gw.Stack,
) -> None:
    c = await _live(stack, "tun-slow")
    platform = Platform(stack.grpc_address, "tun-slow", stack.platform_token)
    total = 64 * 1024 * 1024
    bound = _stalled_session_bound()
    assert bound < total // 3  # the test can tell a bounded path from an unbounded one
    chunk = os.urandom(64 * 1024)
    try:
        session_id = await _offered_session(stack, c, platform)
        async with await _dial(stack, c, session_id, max_queue=COLLECTOR_QUEUE_FRAMES) as ws:
            # The kernel would otherwise grow this receive buffer (up to tcp_rmem's ceiling,
            # 32 MiB on some hosts): the collector's own buffer, not the control plane's.
            ws.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVBUF, COLLECTOR_RCVBUF
            )
            # The client offered permessage-deflate; the gateway never accepts compression.
            assert ws.protocol.extensions == []
            await platform.next()  # ready
            for _ in range(total // len(chunk)):
                platform.outbox.put_nowait(pb.OpenTunnelRequest(data=chunk))
            # The collector reads nothing meanwhile: the platform's writes stop once the buffers
            # along the path are full. A path without a bound would stop only at 64 MiB.
            await _until_stalled(platform)
            assert platform.sent <= bound, (platform.sent, bound)
            received = 0
            while received < total:
                received += len(await asyncio.wait_for(ws.recv(), 10))
            assert (received, platform.sent) == (total, total)
    finally:
        await platform.close()


@pytest.mark.parametrize("moment", ["before_subscribing", "after_subscribing", "while_held"])
async def test_an_offer_made_at_any_moment_of_a_held_claim_wakes_it(
    stack: gw.Stack, moment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offer reaches the claim held at the time, whenever it is made: while the claim's
    wake-up subscription is being set up, just after, or while the claim waits (the router's
    claim on real Redis; a lost wake-up would leave the claim waiting out its hold)."""
    c = await _live(stack, f"tun-at-{moment.replace('_', '-')}")
    router, hub = stack.router, stack.router.tunnels
    offered = asyncio.Event()

    async def offer() -> None:
        await hub.offer(c.collector_id, "10.0.0.7", 22)
        offered.set()

    real_subscribed, real_take = router.wake._subscribed, hub.take_offers
    first_take_done = asyncio.Event()

    async def subscribed(key: str) -> None:
        if key == c.collector_id and moment == "before_subscribing":
            await offer()
        await real_subscribed(key)
        if key == c.collector_id and moment == "after_subscribing":
            await offer()

    async def take_offers(collector_id: str) -> list[dict[str, object]]:
        taken: list[dict[str, object]] = await real_take(collector_id)
        if collector_id == c.collector_id:
            first_take_done.set()
        return taken

    monkeypatch.setattr(router.wake, "_subscribed", subscribed)
    monkeypatch.setattr(hub, "take_offers", take_offers)
    hold_s = 25.0
    loop = asyncio.get_running_loop()
    started = loop.time()
    held = asyncio.create_task(
        router.claim_with_offers(c.collector_id, claim_seq=0, held_task_ids=frozenset(), wait_s=hold_s)
    )
    if moment == "while_held":
        await asyncio.wait_for(first_take_done.wait(), 10)
        assert not held.done()
        await offer()
    answer = await asyncio.wait_for(held, hold_s + 10)
    assert offered.is_set()
    assert [(o["type"], o["host"], o["port"]) for o in answer.offers] == [("tunnel", "10.0.0.7", 22)]
    # Woken by the offer, not found at the end of the hold.
    assert loop.time() - started < hold_s - 5
