"""The platform's end of a tunnel, attached to this gateway: ``ws://<attach address>/v1/tunnel``.

Served on the gateway's internal listener (``VERSUS_GATEWAY_ATTACH_HOST``/``_PORT``), never on
the collectors' port: a plain ``websockets`` server, no ASGI on the byte path. The only
credential it takes is a session's ticket (common/tunnel/record.py) as the bearer token: it must
name a session held here whose first leg is open, within 30 seconds of that, once. The router
decided who may open the session (RBAC, tenant scope, audit) before it handed the ticket out.
The frames are common/tunnel/attach.py's.

Flow control: bytes from the platform go into the collector leg's window (common/tunnel/end.py),
and the socket is not read while that is full; bytes toward the platform are sent one frame at a
time, each waiting until the socket took the one before. A platform that stops reading stops
the device's writes at the window; one that writes faster than the device reads is held there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import weakref

import websockets
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

from common.telemetry.logs import get_logger
from common.tunnel import frames
from common.tunnel.attach import ATTACH_PATH, MAX_FRAME_BYTES, SOCKET_OPTIONS, keep_alive
from common.tunnel.end import SessionEnded, TunnelEnd
from common.tunnel.record import ticket_matches, ticket_session
from gateway.metrics import TUNNEL_BYTES
from gateway.tunnels.held import HeldSession, TunnelRegistry

# The receive buffer of an attached platform's socket (the kernel doubles it for its bookkeeping).
ATTACH_RCVBUF_BYTES = 1024 * 1024

log = get_logger("versus.gateway.tunnel")


def _refusal(connection: ServerConnection, status: int, code: str, message: str) -> Response:
    response = connection.respond(status, json.dumps({"error": {"code": code, "message": message}}))
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = "application/json"
    return response


class AttachListener:
    """The internal listener where platform ends attach to the sessions this gateway holds."""

    def __init__(self, registry: TunnelRegistry):
        self.registry = registry
        self.server: Server | None = None
        # Admitted by the handshake, picked up by the handler (a handshake that fails leaves nothing).
        self._attached: weakref.WeakKeyDictionary[ServerConnection, HeldSession] = weakref.WeakKeyDictionary()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: a free port); returns the port bound."""
        self.server = await serve(self._serve, host, port, process_request=self._admit, **SOCKET_OPTIONS)
        bound: int = self.server.sockets[0].getsockname()[1]
        return bound

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path != ATTACH_PATH:
            return _refusal(connection, 404, "not_found", f"tunnels attach at {ATTACH_PATH}")
        authorization = request.headers.get("Authorization", "")
        ticket = authorization.removeprefix("Bearer ").strip()
        session_id = ticket_session(ticket)
        held = self.registry.ticket_holder(session_id) if session_id else None
        if held is None or not ticket_matches(ticket, held.record.ticket_sha256):
            return _refusal(
                connection, 401, "tunnel_ticket_invalid", "the tunnel ticket is unknown, used or expired"
            )
        held.attached = True  # single use: a second attachment with the same ticket is refused
        self._attached[connection] = held
        sock = connection.transport.get_extra_info("socket")
        keep_alive(sock)
        if sock is not None:
            # Pinned (no autotuning): what the kernel holds of a platform writing to a session whose
            # device does not read stays at this, beside the session's own window.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, ATTACH_RCVBUF_BYTES)
        return None

    async def _serve(self, ws: ServerConnection) -> None:
        held = self._attached.pop(ws)
        end = held.end
        log.info("tunnel attached", session_id=held.session_id)
        reader = asyncio.create_task(_from_platform(ws, end))
        try:
            to_platform = TUNNEL_BYTES.labels("to_platform")
            while True:
                chunk = await end.read()
                await ws.send(frames.EOF if chunk is None else chunk)
                if chunk is not None:
                    to_platform.inc(len(chunk))
        except SessionEnded:
            pass
        except websockets.ConnectionClosed:
            end.end("platform_gone")
        finally:
            end.end(end.reason or "platform_gone")
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            await ws.close(1000, end.reason)


async def _from_platform(ws: ServerConnection, end: TunnelEnd) -> None:
    """The platform's frames toward the device; its socket closing first ends the session."""
    to_device = TUNNEL_BYTES.labels("to_device")
    try:
        async for message in ws:
            if isinstance(message, str):
                if message != frames.EOF:
                    end.end("tunnel_frame_invalid")
                    return
                end.write_eof()
            elif len(message) > MAX_FRAME_BYTES:
                end.end("frame_too_large")
                return
            else:
                await end.write(message)
                to_device.inc(len(message))
    except SessionEnded:
        return
    except websockets.ConnectionClosed:
        pass
    end.end("platform_gone")
