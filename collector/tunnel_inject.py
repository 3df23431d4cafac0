"""Local credential injection for tunnels: the collector adds the device's credentials itself.

``credentials.json`` maps a tunnel destination to a local credential::

    {"http":    {"lb-1": {"base_url": "https://10.0.0.5", "ca_file": "/etc/...", "bearer": "..."}},
     "tunnels": {"10.0.0.5:443": {"inject": "http", "target_ref": "lb-1"}}}

A tunnel offered for ``10.0.0.5:443`` is then not a raw byte relay. The
platform speaks plain HTTP/1.1 into the tunnel; the collector parses each
request, refuses anything but an origin-form path (so a request cannot steer
the credential to another host), replaces any ``Authorization`` header with
the local one, sends it to the device over TLS verified with the local CA file,
and streams the response back. The credential and the device's TLS session
never cross the control plane. Tunnels without an entry stay raw byte relays.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import h11
import httpx

from common.telemetry.logs import get_logger

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
# Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the collector sets itself.
_DROP_REQUEST = {b"authorization", b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te",
                 b"upgrade", b"proxy-authorization", b"proxy-connection", b"content-length"}  # fmt: skip
_DROP_RESPONSE = {b"connection", b"keep-alive", b"transfer-encoding", b"upgrade"}

log = get_logger("versus.collector.tunnel")

Receive = Callable[[], Awaitable[bytes | None]]  # None: the platform closed its direction
Send = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class HttpInjector:
    """Forwards the platform's HTTP/1.1 requests to one device, with the local credential added."""

    base_url: str
    authorization: str = field(repr=False)  # a secret: never in repr or logs
    ca_file: str | None = None

    async def serve(self, receive: Receive, send: Send) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        verify: ssl.SSLContext | bool = True
        if self.ca_file:
            verify = ssl.create_default_context(cafile=self.ca_file)
        async with httpx.AsyncClient(verify=verify, timeout=30) as client:
            while True:
                try:
                    request = await _next(conn, receive)
                    if not isinstance(request, h11.Request):
                        return  # the platform closed the connection between requests
                    body = bytearray()
                    while not isinstance(event := await _next(conn, receive), h11.EndOfMessage):
                        if not isinstance(event, h11.Data):
                            return
                        body += event.data
                        if len(body) > MAX_BODY_BYTES:
                            await _reply(conn, send, 413, b"request body over 8 MiB\n")
                            return
                except h11.RemoteProtocolError as exc:
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        await _reply(conn, send, 400, f"malformed HTTP request: {exc}\n".encode())
                    return
                target = request.target
                if not target.startswith(b"/") or target.startswith(b"//"):
                    await _reply(conn, send, 400, b"only origin-form request targets (/path) are allowed\n")
                    return
                await self._forward(client, conn, send, request, bytes(body))
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()

    async def _forward(
        self, client: httpx.AsyncClient, conn: h11.Connection, send: Send, request: h11.Request, body: bytes
    ) -> None:
        headers = [(k, v) for k, v in request.headers if k.lower() not in _DROP_REQUEST]
        headers.append((b"authorization", self.authorization.encode()))
        url = self.base_url.rstrip("/") + request.target.decode("ascii")
        try:
            async with client.stream(request.method.decode(), url, headers=headers, content=body) as response:
                kept = [(k, v) for k, v in response.headers.raw if k.lower() not in _DROP_RESPONSE]
                await send(conn.send(h11.Response(status_code=response.status_code, headers=kept)))
                async for chunk in response.aiter_raw():
                    await send(conn.send(h11.Data(data=chunk)))
                await send(conn.send(h11.EndOfMessage()))
        except httpx.HTTPError as exc:
            log.warning("injected request failed", reason=type(exc).__name__)
            if conn.our_state is h11.SEND_RESPONSE:
                await _reply(conn, send, 502, f"device unreachable: {type(exc).__name__}\n".encode())
            else:
                raise ConnectionError("device response broke off") from None


async def _next(conn: h11.Connection, receive: Receive) -> Any:
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await receive() or b"")
    return event


async def _reply(conn: h11.Connection, send: Send, status: int, text: bytes) -> None:
    headers = [("content-type", "text/plain"), ("content-length", str(len(text))), ("connection", "close")]
    await send(conn.send(h11.Response(status_code=status, headers=headers)) + conn.send(h11.Data(data=text)))
    await send(conn.send(h11.EndOfMessage()))


def injector_for(host: str, port: int, credentials: Mapping[str, Any]) -> HttpInjector | None:
    """The injector configured for this tunnel destination, or None for a raw byte relay."""
    entry = credentials.get("tunnels", {}).get(f"{host}:{port}")
    if entry is None:
        return None
    if entry.get("inject") != "http":
        raise ValueError(f"tunnel {host}:{port}: unsupported inject mode {entry.get('inject')!r}")
    target = credentials.get("http", {}).get(entry.get("target_ref", ""))
    if target is None:
        raise ValueError(f"tunnel {host}:{port}: no http credentials named {entry.get('target_ref')!r}")
    if "bearer" in target:
        authorization = f"Bearer {target['bearer']}"
    elif "username" in target:
        pair = f"{target['username']}:{target.get('password', '')}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode()
    else:
        raise ValueError(f"tunnel {host}:{port}: the http credentials carry no bearer or username")
    return HttpInjector(str(target["base_url"]), authorization, target.get("ca_file"))
