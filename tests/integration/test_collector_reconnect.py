"""How the reference collector's client comes back after losing its gateway (collector/client.py,
collector/ws_control.py), against a real TLS WebSocket server on loopback that plays the gateway:
a busy or restarting gateway is retried on a socket after the backoff it asks for, never by
falling back to HTTPS (which would meet the same gateway and cost one more handshake per
collector); a socket cut at once, as proxies that break WebSockets do, still falls back.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from collector import client as client_module
from collector.client import GatewayClient
from collector.gateway_errors import GatewayUnavailable
from common.embedded.process import free_port
from common.trust.tls import ensure_gateway_tls
from tests.support.pki import p256

pytestmark = pytest.mark.timeout(60)
CLAIM = {"wait_s": 0, "session_id": "s-1"}


@dataclass
class FakeGateway:
    """Answers upgrades as ``mode`` says and counts them. It serves no plain HTTPS (a POST is
    dropped unanswered), so a call that fell back to HTTPS fails with httpx's error, one made on
    a socket with "control socket" in its message."""

    mode: str = "busy"
    upgrades: int = 0
    sockets: list[ServerConnection] = field(default_factory=list)

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        self.upgrades += 1
        if self.mode == "busy":
            body = b'{"error": {"code": "gateway_busy", "message": "retry soon"}}'
            headers = Headers({"Retry-After": "7", "Content-Length": str(len(body))})
            return Response(503, "Service Unavailable", headers, body)
        if self.mode == "proxy-502":  # a proxy that cannot pass the upgrade answers with its own page
            body = b"<html>Bad Gateway</html>"
            return Response(502, "Bad Gateway", Headers({"Content-Length": str(len(body))}), body)
        return None

    async def handler(self, ws: ServerConnection) -> None:
        self.sockets.append(ws)
        with contextlib.suppress(ConnectionClosed):
            await self._serve(ws)

    async def _serve(self, ws: ServerConnection) -> None:
        async for _ in ws:
            if self.mode == "restart":
                await ws.close(1012, "service restart")  # what a draining gateway sends
            elif self.mode == "cut":
                assert ws.transport is not None
                ws.transport.abort()  # a proxy that breaks WebSockets: no closing frame


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, fake: FakeGateway) -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    tls = ensure_gateway_tls(tmp_path / "tls", "localhost", [])
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tls.cert_file, tls.key_file)
    client_tls = ssl.create_default_context(cafile=str(tls.ca_file))
    server: Server
    async with serve(
        fake.handler, "127.0.0.1", 0, ssl=server_tls, process_request=fake.process_request
    ) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"https://localhost:{port}", client_tls


def _client(url: str, context: ssl.SSLContext) -> GatewayClient:
    return GatewayClient(url, context, p256(), "col-reconnect", prefer_websocket=True, ws_retry_s=60)


async def _claims_each_on_a_new_socket(tmp_path: Path, fake: FakeGateway) -> int:
    """Two claims whose sockets the fake ends: each fails on a socket (never over HTTPS); the
    number of upgrades the fake saw."""
    async with gateway(tmp_path, fake) as (url, context):
        client = _client(url, context)
        try:
            for _ in range(2):
                with pytest.raises(GatewayUnavailable, match=r"^control socket"):
                    await client.claim(CLAIM, 0)
        finally:
            await client.close()
    return fake.upgrades


async def test_a_busy_gateway_is_retried_on_a_socket_after_the_wait_it_asked_for(tmp_path: Path) -> None:
    fake = FakeGateway("busy")
    async with gateway(tmp_path, fake) as (url, context):
        client = _client(url, context)
        try:
            for _ in range(2):
                with pytest.raises(GatewayUnavailable) as unavailable:
                    await client.claim(CLAIM, 0)
                assert unavailable.value.retry_after_s == 7.0
                assert str(unavailable.value) == "control socket: HTTP 503 gateway_busy"  # not HTTPS's
        finally:
            await client.close()
    assert fake.upgrades == 2  # each call tried the socket again


async def test_a_socket_the_gateway_closes_for_a_restart_is_reopened_not_replaced_by_https(
    tmp_path: Path,
) -> None:
    assert await _claims_each_on_a_new_socket(tmp_path, FakeGateway("restart")) == 2


async def test_a_proxys_5xx_to_the_upgrade_falls_back_to_https(tmp_path: Path) -> None:
    # Not the gateway's answer (no error body with a code): something between breaks WebSockets.
    fake = FakeGateway("proxy-502")
    async with gateway(tmp_path, fake) as (url, context):
        client = _client(url, context)
        try:
            with pytest.raises(GatewayUnavailable, match=r"^claim: RemoteProtocolError"):
                await client.claim(CLAIM, 0)  # sent over HTTPS at once (this fake drops it)
            assert client.transport == "https"
        finally:
            await client.close()
    assert fake.upgrades == 1


async def test_a_socket_cut_at_once_falls_back_to_https(tmp_path: Path) -> None:
    fake = FakeGateway("cut")
    async with gateway(tmp_path, fake) as (url, context):
        client = _client(url, context)
        try:
            # The same claim goes out again over HTTPS at once (this fake drops it unanswered).
            with pytest.raises(GatewayUnavailable, match=r"^claim: RemoteProtocolError"):
                await client.claim(CLAIM, 0)
            assert client.transport == "https"
            with pytest.raises(GatewayUnavailable, match=r"^claim: RemoteProtocolError"):
                await client.claim(CLAIM, 0)
        finally:
            await client.close()
    assert fake.upgrades == 1  # the socket is tried again only after --ws-retry


async def test_a_steady_socket_that_drops_is_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A socket that served for a while and then dropped (a gateway SIGKILLed): not a proxy's doing.
    monkeypatch.setattr(client_module, "WS_STEADY_S", 0.0)
    assert await _claims_each_on_a_new_socket(tmp_path, FakeGateway("cut")) == 2


async def test_nothing_listening_is_unavailable_without_an_https_attempt() -> None:
    client = _client(f"https://127.0.0.1:{free_port()}", ssl.create_default_context())
    try:
        with pytest.raises(GatewayUnavailable) as unavailable:
            await client.claim(CLAIM, 0)
        assert str(unavailable.value) == "control socket: ConnectionRefusedError"
    finally:
        await client.close()
