"""Attaching the platform's end to a tunnel session: a WebSocket to the gateway that holds it.

``OpenTunnel`` (with ``direct``) answers ``ready`` with the holding gateway's attach URL and a
single-use ticket; the platform opens ``GET <attach_url>`` with ``Authorization: Bearer
<ticket>`` on the gateway's internal listener (docs/gateway.md, "Attaching to a session"):

- binary frames, up to :data:`MAX_FRAME_BYTES` each, are the session's bytes, both ways;
- the text frame ``eof`` closes one direction (half-close), both ways; no other text frame;
- the gateway closes the socket when the session ends, with code 1000 and the session's stable
  reason as the close reason (``done`` when both directions closed); a platform that closes
  its socket first ends the session (``platform_gone``).

A refused attachment is an HTTP answer with the error body (``tunnel_ticket_invalid``: 401).
Flow control is the socket's: a side that stops reading stops the other's writes.
"""

from __future__ import annotations

import socket
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from common.tunnel import frames

ATTACH_PATH = "/v1/tunnel"
MAX_FRAME_BYTES = frames.MAX_FRAME_BYTES[frames.V2]
OPEN_TIMEOUT_S = 10.0
# Frames the client library keeps unread before it stops reading the socket (the bound on what a
# platform that does not read holds in this library: this many frames).
MAX_QUEUE_FRAMES = 2
# The socket options both ends use: large frames, no compression (tunnel bytes are usually
# encrypted already, and no decompression bombs), a small read queue for backpressure.
SOCKET_OPTIONS: dict[str, Any] = {
    "max_size": MAX_FRAME_BYTES,
    "max_queue": MAX_QUEUE_FRAMES,
    "compression": None,
    "ping_interval": None,  # TCP keepalives instead (keep_alive)
}


def attach_url(address: str) -> str:
    """The attach URL of a gateway whose internal listener is at ``address`` (host:port)."""
    return f"ws://{address}{ATTACH_PATH}"


async def attach(url: str, ticket: str) -> ClientConnection:
    """An open socket on the session ``ticket`` was issued for (raises ``websockets``' errors:
    ``InvalidStatus`` carries a refusal's status and error body)."""
    ws = await websockets.connect(
        url,
        additional_headers={"Authorization": f"Bearer {ticket}"},
        open_timeout=OPEN_TIMEOUT_S,
        **SOCKET_OPTIONS,
    )
    keep_alive(ws.transport.get_extra_info("socket"))
    return ws


def keep_alive(sock: socket.socket | None) -> None:
    """TCP keepalives on an attach socket: a peer host that vanished is noticed within a minute.

    Not WebSocket pings: a side that stops reading (backpressure) would leave the other's ping
    unanswered behind the data, and a stalled session is not a dead one."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def end_reason(ws: ClientConnection) -> str:
    """The session's reason from the gateway's close frame (once the socket is closed);
    ``gateway_gone`` without one."""
    received = ws.protocol.close_rcvd
    if received is None or not frames.is_reason(received.reason):
        return "gateway_gone"
    return received.reason
