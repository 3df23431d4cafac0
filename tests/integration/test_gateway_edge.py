"""The gateway's edge under bounded abuse on loopback (gateway/edge.py): idle and slow peers are cut,
one anonymous source cannot fill the gateway, every refusal carries the JSON error body, and a
WebSocket peer cannot flood pings. Real sockets, real uvicorn, real databases behind the app.

Deadlines are shortened (monkeypatched module constants) so each case takes a second, not ten.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
import websockets
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from common.embedded.process import free_port
from common.telemetry.logs import get_logger
from common.trust.tls import ensure_gateway_tls
from gateway import edge, sources
from gateway.metrics import EDGE_REFUSALS
from gateway.server import WS_OPTIONS
from gateway.sources import SourceCounts
from tests.integration import test_gateway_collector as gw

pytestmark = pytest.mark.timeout(90)
log = get_logger("tests.gateway_edge")
stack = gw.stack
Stack = gw.Stack

DEADLINE_S = 0.5
FLOOD_SOURCE = "127.0.0.2"  # the anonymous flood comes from here; collectors from 127.0.0.1


@pytest.fixture(autouse=True)
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge, "FIRST_REQUEST_TIMEOUT_S", DEADLINE_S)
    monkeypatch.setattr(edge, "HEADER_TIMEOUT_S", DEADLINE_S)


def _address(stack: Stack) -> tuple[str, int]:
    parts = urlsplit(stack.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


async def _open(stack: Stack, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*_address(stack), local_addr=(source, 0))


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    """Status, headers and JSON body of the one response the gateway sends before closing."""
    raw = await asyncio.wait_for(reader.read(), 5)  # until EOF: every refusal closes
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body) if body else None


async def test_a_connection_that_never_asks_is_closed(stack: Stack) -> None:
    # Timed from before the connection exists: the gateway's clock starts when it accepts, and on a
    # busy machine a clock started after the connect returns would measure less than the deadline.
    started = time.monotonic()
    reader, writer = await _open(stack)
    try:
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, with nothing to answer
        assert DEADLINE_S <= time.monotonic() - started < DEADLINE_S + 1
    finally:
        writer.close()


async def test_headers_trickled_byte_by_byte_get_408(stack: Stack) -> None:
    reader, writer = await _open(stack)
    started = time.monotonic()

    async def trickle() -> None:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    sender = asyncio.create_task(trickle())
    status, headers, body = await _answer(reader)
    sender.cancel()
    assert (status, body["error"]["code"]) == (408, "header_timeout")
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert time.monotonic() - started < DEADLINE_S + 1
    writer.close()


async def test_the_deadline_applies_to_every_request_not_only_the_first(stack: Stack) -> None:
    c = await stack.enroll("col-edge-k")
    reader, writer = await _open(stack)
    bearer = c.headers_for("GET", gw.API + "/enrollment")["Authorization"]
    request = f"GET {gw.API}/enrollment HTTP/1.1\r\nHost: x\r\nAuthorization: {bearer}\r\n\r\n"
    writer.write(request.encode())
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode().lower()
    assert head.startswith("http/1.1 200") and "connection: close" not in head
    length = int(head.split("content-length: ", 1)[1].split("\r\n", 1)[0])
    await reader.readexactly(length)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # ...and the rest never comes
    status, _, body = await _answer(reader)
    assert (status, body["error"]["code"]) == (408, "header_timeout")
    writer.close()


async def test_oversized_and_malformed_heads_get_json_errors(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
        huge = await client.get("/healthz", headers={"Authorization": "Bearer " + "a" * 100_000})
    assert huge.status_code == 431 and huge.json()["error"]["code"] == "header_too_large"
    reader, writer = await _open(stack)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    status, _, body = await _answer(reader)
    assert (status, body["error"]["code"]) == (400, "http_malformed")
    writer.close()


async def test_anonymous_answers_close_the_connection_authenticated_ones_keep_it(stack: Stack) -> None:
    c = await stack.enroll("col-edge-ka")
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
        anonymous = await client.get("/healthz")
        claimed = await client.post(gw.API + "/claim", json={"wait_s": 0}, auth=c.auth)
    assert anonymous.headers["connection"] == "close"
    assert claimed.status_code == 204 and "connection" not in claimed.headers


async def test_an_anonymous_flood_is_capped_per_source_and_collectors_stay_served(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough that the flood is held for the whole measurement.
    monkeypatch.setattr(edge, "FIRST_REQUEST_TIMEOUT_S", 30.0)
    cap, flood = 50, 400
    monkeypatch.setattr(edge, "MAX_ANONYMOUS_PER_SOURCE", cap)
    c = await stack.enroll("col-edge-flood")
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
        quiet = []
        for _ in range(20):
            started = time.perf_counter()
            assert (await client.post(gw.API + "/claim", json={"wait_s": 0}, auth=c.auth)).status_code == 204
            quiet.append(time.perf_counter() - started)

    held = [await _open(stack, FLOOD_SOURCE) for _ in range(flood)]
    await asyncio.sleep(0.2)
    refused = []
    for reader, _ in held[cap:]:
        status, _, body = await _answer(reader)
        refused.append((status, body["error"]["code"]))
    assert set(refused) == {(503, "too_many_connections")} and len(refused) == flood - cap
    assert edge.anonymous_count(FLOOD_SOURCE) == cap

    # A collector from another address, on fresh connections, while the flood is held.
    during = []
    for _ in range(20):
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            started = time.perf_counter()
            assert (await client.post(gw.API + "/claim", json={"wait_s": 0}, auth=c.auth)).status_code == 204
            during.append(time.perf_counter() - started)
    quiet_ms, during_ms = statistics.median(quiet) * 1000, statistics.median(during) * 1000
    log.info("claim latency", quiet_p50_ms=round(quiet_ms, 1), flood_p50_ms=round(during_ms, 1))
    # Not a speed assertion: the flood must not starve the collector (seconds would mean queued behind it).
    assert max(during) < 2.0
    for _, writer in held:
        writer.close()


async def test_a_websocket_ping_flood_is_cut_with_4429(stack: Stack) -> None:
    c = await stack.enroll("col-edge-ping")
    async with await gw._ws(stack, c) as ws:
        for _ in range(edge.PING_BURST * 3):
            await ws.ping()
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4429, "too_many_pings")


async def test_a_websocket_keepalive_within_the_rate_is_untouched(stack: Stack) -> None:
    c = await stack.enroll("col-edge-ping-ok")
    async with await gw._ws(stack, c) as ws:
        for _ in range(edge.PING_BURST - 2):
            await asyncio.wait_for(await ws.ping(), 5)  # each answered with a pong


@contextlib.asynccontextmanager
async def _second_server(stack: Stack, **options: Any) -> AsyncIterator[int]:
    """The same (already started) gateway app on another port with other server options."""
    port = free_port()
    settings = {**WS_OPTIONS, **options}
    config = uvicorn.Config(
        stack.app, host="127.0.0.1", port=port, log_config=None, lifespan="off", **settings
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes only this flag
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def tls_server(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[int, Path]]:
    """The same gateway app behind real TLS, with a short handshake bound."""
    monkeypatch.setattr(asyncio.constants, "SSL_HANDSHAKE_TIMEOUT", DEADLINE_S)
    material = ensure_gateway_tls(tmp_path / "tls", "gw.test", ["127.0.0.1"])
    assert material.ca_file is not None
    options = {"ssl_certfile": str(material.cert_file), "ssl_keyfile": str(material.key_file)}
    async with _second_server(stack, **options) as port:
        yield port, material.ca_file


async def test_the_connection_limit_answers_json_503(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge, "FIRST_REQUEST_TIMEOUT_S", 30.0)
    async with _second_server(stack, limit_concurrency=2) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        status, headers, body = await _answer(reader)
        assert (status, body["error"]["code"], headers["retry-after"]) == (503, "gateway_busy", "2")
        for _, w in [*held, (reader, writer)]:
            w.close()


async def test_tls_handshake_and_first_request_are_bounded(tls_server: tuple[int, Path]) -> None:
    port, ca = tls_server
    # TCP connected, no ClientHello: cut when the handshake bound passes.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert time.monotonic() - started < DEADLINE_S + 1
    writer.close()
    # TLS done, then silence: cut after the first-request deadline.
    context = ssl.create_default_context(cafile=str(ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="gw.test")
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert DEADLINE_S <= time.monotonic() - started < DEADLINE_S + 1
    writer.close()


async def test_an_early_answer_is_delivered_and_the_unread_body_bounded(stack: Stack) -> None:
    reader, writer = await _open(stack)
    writer.write(
        f"POST {gw.API}/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n{".encode()
    )
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode().lower()
    assert head.startswith("http/1.1 413")  # refused on Content-Length alone, before the body
    started = time.monotonic()
    length = int(head.split("content-length: ", 1)[1].split("\r\n", 1)[0])
    assert json.loads(await reader.readexactly(length))["error"]["code"] == "body_too_large"
    # The announced body never comes: the connection is not held for it.
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert time.monotonic() - started < DEADLINE_S + 1
    writer.close()


@pytest.mark.parametrize("after_cut_s", [0.0, 1.0])
async def test_a_peer_that_pings_without_reading_is_cut_with_4408_and_its_output_bounded(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, after_cut_s: float
) -> None:
    # The reported case: pings sent flat out by a peer that never reads. The ping rate limit is
    # lifted here so that only the bound on unread output acts (4429 is tested above). With
    # after_cut_s the peer goes on sending after the cut: the gateway must go on reading (and
    # dropping) it, or its close meets unread bytes, becomes a reset, and the closing frame it
    # still held for the peer is lost (seen with every core busy).
    monkeypatch.setattr(edge, "PING_BURST", 10**9)
    bound = 256 * 1024
    monkeypatch.setattr(edge, "MAX_WS_WRITE_BUFFER_BYTES", bound)
    monkeypatch.setattr(edge, "CLOSE_GRACE_S", 30.0)  # the closing frame waits while we are not reading
    buffered: list[int] = []
    cut_off = edge.EdgeWebSocketProtocol._cut_off

    def recording(self: edge.EdgeWebSocketProtocol, code: int, reason: str) -> None:
        if not self._cut:
            buffered.append(self.transport.get_write_buffer_size())
        cut_off(self, code, reason)

    monkeypatch.setattr(edge.EdgeWebSocketProtocol, "_cut_off", recording)
    c = await stack.enroll("col-edge-unread")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for us
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, _address(stack))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    try:
        await _flood_unread(stack, c, reader, writer, bound, buffered, after_cut_s)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _flood_unread(
    stack: Stack, c: gw.Collector, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bound: int,
    buffered: list[int], after_cut_s: float = 0.0,
) -> None:  # fmt: skip
    path = gw.API + "/control"
    client = ClientProtocol(parse_uri(stack.url.replace("http://", "ws://") + path))
    request = client.connect()
    request.headers.update(c.headers_for("GET", path))
    client.send_request(request)
    writer.write(b"".join(client.data_to_send()))
    while client.state is State.CONNECTING:
        client.receive_data(await asyncio.wait_for(reader.read(4096), 5))
    assert client.state is State.OPEN, client.handshake_exc
    client.send_ping(b"p" * 125)
    ping = b"".join(client.data_to_send())
    cut = EDGE_REFUSALS.labels("peer_not_reading")
    before = cut._value.get()
    sent = 0
    # Flat out until the gateway cuts the peer off (it stops reading us then), at most 80,000
    # pings (10.5 MB: far beyond every buffer on the way back).
    while cut._value.get() == before and sent < 80_000:
        writer.write(ping * 800)
        sent += 800
        while True:
            try:
                await asyncio.wait_for(writer.drain(), 0.5)
                break
            except TimeoutError:
                if cut._value.get() > before:
                    break
    assert cut._value.get() == before + 1
    # A peer that goes on sending for a while (it did not read, so it does not know yet).
    ends = asyncio.get_running_loop().time() + after_cut_s
    while asyncio.get_running_loop().time() < ends:
        writer.write(ping * 800)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(writer.drain(), 0.1)
    # Now read: the pongs the gateway had buffered, then its closing frame.
    pongs = 0
    while client.close_rcvd is None:
        data = await asyncio.wait_for(reader.read(65536), 10)
        if not data:
            break
        client.receive_data(data)
        pongs += sum(isinstance(e, Frame) and e.opcode is Opcode.PONG for e in client.events_received())
    assert client.close_rcvd is not None
    assert (client.close_rcvd.code, client.close_rcvd.reason) == (4408, "peer_not_reading")
    # What waited in the gateway for this peer never grew past the bound; the rest of the
    # answered pings sat in the kernels' socket buffers.
    assert len(buffered) == 1 and 0 < buffered[0] <= bound, buffered
    assert 0 < pongs < sent


async def test_an_address_earns_room_with_the_collectors_that_authenticated_from_it(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet behind one NAT address reconnecting together is not refused as a flood: the cap on
    not-yet-authenticated connections grows with the collectors recently seen from the address,
    and a restarted gateway knows them at once (gateway/sources.py)."""
    monkeypatch.setattr(edge, "FIRST_REQUEST_TIMEOUT_S", 30.0)
    cap, fleet, nat = 10, 6, "127.0.0.3"
    monkeypatch.setattr(edge, "MAX_ANONYMOUS_PER_SOURCE", cap)
    collectors = [await stack.enroll(f"col-edge-nat-{i}") for i in range(fleet)]
    transport = httpx.AsyncHTTPTransport(local_address=nat)
    async with httpx.AsyncClient(base_url=stack.url, timeout=10, transport=transport) as client:
        for i, c in enumerate(collectors):
            assert (await client.post(gw.API + "/claim", json={"wait_s": 0}, auth=c.auth)).status_code == 204
            if i == fleet // 2:
                # The rest in a later flush (once a second): the count is of all, not of one flush.
                await asyncio.sleep(sources.FLUSH_S * 1.5)
        # Anonymous requests and a forged bearer from another address earn it nothing.
        forged = {"authorization": "Bearer " + "e30." * 2 + "x"}
        async with httpx.AsyncClient(
            base_url=stack.url, timeout=10, transport=httpx.AsyncHTTPTransport(local_address=FLOOD_SOURCE)
        ) as other:
            assert (
                await other.post(gw.API + "/claim", json={"wait_s": 0}, headers=forged)
            ).status_code == 401
    async with asyncio.timeout(5):  # counted within a flush (once a second)
        while edge.anonymous_limit(nat) < cap + fleet:  # noqa: ASYNC110 - memory, no event
            await asyncio.sleep(0.05)
    assert edge.anonymous_limit(nat) == cap + fleet
    assert edge.anonymous_limit(FLOOD_SOURCE) == cap

    held = [await _open(stack, nat) for _ in range(cap + fleet + 4)]
    await asyncio.sleep(0.2)
    refused = [await _answer(reader) for reader, _ in held[cap + fleet :]]
    assert {(status, body["error"]["code"]) for status, _, body in refused} == {(503, "too_many_connections")}
    assert edge.anonymous_count(nat) == cap + fleet
    for _, writer in held:
        writer.close()

    # A gateway started now (this one killed and restarted, say) reads the counts before serving.
    restarted = SourceCounts(stack.redis)
    await restarted.start()
    try:
        assert restarted.earned.get(nat) == fleet
        assert FLOOD_SOURCE not in restarted.earned
    finally:
        await restarted.stop()
