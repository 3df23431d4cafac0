"""The collector's end of a tunnel: ``wss://<gateway>/api/collector/v1/tunnel?session=<id>&v=<n>``.

The collector opens it after a claim offered the session, and again after its socket dropped
(protocol 2: the session resumes). The gateway checks the bearer token and that the session was
offered to this very collector, answers with the tunnel protocol the leg speaks (the
``x-versus-tunnel-protocol`` header: the highest both speak; a collector that names none speaks
1), then carries the session over the socket (common/tunnel/end.py). Frames and limits per
version: common/tunnel/frames.py and docs/gateway.md. The socket is closed with 4401 if the
collector's standing lapses; a session that ends closes it with 1000 and the session's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from common.errors import InvalidArgument, VersusError
from common.tunnel import frames
from common.tunnel.end import LegClosed, TunnelEnd
from gateway.auth import admit_socket, close_socket, deny
from gateway.metrics import TUNNEL_RESUMES
from gateway.standing import standing_lapsed
from gateway.tunnels.held import HeldSession, TunnelRegistry

PROTOCOL_HEADER = "x-versus-tunnel-protocol"

# Close codes other than 1000 for sessions that end because of what the collector sent.
CLOSE_CODES = {
    "frame_too_large": 1009,
    "tunnel_frame_invalid": 1008,
    "tunnel_window_exceeded": 1008,
    "tunnel_data_after_eof": 1008,
    "tunnel_ack_out_of_range": 1008,
    "tunnel_resume_out_of_range": 1008,
}

router = APIRouter(prefix="/api/collector/v1")


class SocketLeg:
    """A tunnel leg over an accepted ASGI WebSocket (uvicorn's protocol does the backpressure:
    a send waits while the peer does not read, and the socket is not read between receives)."""

    def __init__(self, ws: WebSocket):
        self.ws = ws

    async def send(self, message: bytes | str) -> None:
        try:
            if isinstance(message, bytes):
                await self.ws.send_bytes(message)
            else:
                await self.ws.send_text(message)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise LegClosed() from exc

    async def receive(self) -> bytes | str:
        try:
            message = await self.ws.receive()
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise LegClosed() from exc
        if message["type"] == "websocket.disconnect":
            code = message.get("code", 1006)
            raise LegClosed(clean=code == 1000, reason=message.get("reason") or "")
        data = message.get("bytes")
        return data if data is not None else str(message.get("text") or "")


def _offered_version(ws: WebSocket) -> int:
    raw = ws.query_params.get("v", "1")
    if not raw.isdigit() or len(raw) > 3:
        raise InvalidArgument("v must be a tunnel protocol version", code="tunnel_version_invalid")
    return frames.negotiate(int(raw))


@router.websocket("/tunnel")
async def tunnel(ws: WebSocket) -> None:
    state = ws.app.state
    admitted = await admit_socket(ws, state.store)
    if admitted is None:
        return
    claims, _ = admitted
    registry: TunnelRegistry = state.tunnels
    try:
        held = await registry.take(
            ws.query_params.get("session", ""), claims.collector_id, _offered_version(ws)
        )
    except VersusError as exc:
        await deny(ws, exc)
        return
    end = held.end
    await ws.accept(headers=[(PROTOCOL_HEADER.encode(), str(end.version).encode())])
    await held.stop_leg()  # a previous leg still running was half-open: the collector is back
    if end.legs:
        TUNNEL_RESUMES.inc()
    carrying = held.leg = asyncio.create_task(end.run_leg(SocketLeg(ws)))
    held.leg_lost_at = None
    watcher = asyncio.create_task(standing_lapsed(state, claims.collector_id))
    close_code, close_reason = 1000, ""
    try:
        await asyncio.wait({carrying, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher.done() and not watcher.cancelled():
            close_code, close_reason = 4401, watcher.result()
            end.end("collector_gone")
        broke = await carrying
    except asyncio.CancelledError:
        if not carrying.cancelled():
            raise
        # A newer leg of the same session took over: this socket is stale.
        await close_socket(ws, 1000, "replaced")
        return
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    _leg_ended(held, end, broke)
    if end.ended.is_set():
        if close_code == 1000:
            close_code = CLOSE_CODES.get(end.reason, 1000)
        await close_socket(ws, close_code, close_reason or end.reason)


def _leg_ended(held: HeldSession, end: TunnelEnd, broke: LegClosed | None) -> None:
    """The leg is over: the session ended, the collector closed it on purpose, or it dropped."""
    if broke is None or end.ended.is_set():
        return
    if broke.clean or end.version < frames.V2:
        # Closed on purpose, or a protocol-1 leg (no resume): the session ends with it.
        clean = broke.clean and frames.is_reason(broke.reason)
        end.end(broke.reason if clean else "collector_gone")
    elif held.leg_lost_at is None:
        held.leg_lost_at = time.monotonic()  # a re-dial within the resume window picks it up
