"""The collector's end of a tunnel: ``wss://<gateway>/api/collector/v1/tunnel?session=<id>``.

The collector opens it after a claim offered the session. The gateway checks
the bearer token, that the session was offered to this very collector, then
relays bytes to the router holding the platform's end (``RelayTunnel``).
Frames: binary = bytes; the text frame ``eof`` = this direction is closed
(half-close); ``error:target_unreachable`` = the collector could not connect
to the device (the session ends with that reason at once). Limits: 64 KiB per
frame, the router's bounded queues for backpressure, the router's idle
timeout and maximum session length; the socket is closed if the collector's
standing lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc

from common.errors import PermissionDenied
from common.grpc.client import aio_channel
from common.telemetry.logs import get_logger
from gateway.auth import admit_socket, close_socket, deny
from gateway.standing import standing_lapsed

MAX_FRAME_BYTES = 64 * 1024
EOF_FRAME = "eof"
# "error:<reason>": the collector could not open the device connection (then it hangs up).
ERROR_PREFIX = "error:"

router = APIRouter(prefix="/api/collector/v1")
log = get_logger("versus.gateway.tunnel")


@router.websocket("/tunnel")
async def tunnel(ws: WebSocket) -> None:
    state = ws.app.state
    admitted = await admit_socket(ws, state.store)
    if admitted is None:
        return
    claims, _ = admitted
    session_id = ws.query_params.get("session", "")
    raw = await state.connections.redis.get("versus:tunnel:" + session_id) if session_id else None
    record = json.loads(raw) if raw else None
    if record is None or record.get("collector_id") != claims.collector_id:
        # Unknown and someone else's look the same.
        await deny(ws, PermissionDenied("no such tunnel session for this collector", code="tunnel_not_yours"))
        return
    await ws.accept()
    outbound: asyncio.Queue[pb.RelayTunnelRequest | None] = asyncio.Queue(32)
    await outbound.put(
        pb.RelayTunnelRequest(hello=pb.RelayHello(session_id=session_id, collector_id=claims.collector_id))
    )

    async def requests() -> AsyncIterator[pb.RelayTunnelRequest]:
        while (item := await outbound.get()) is not None:
            yield item

    async def from_collector() -> None:
        half_closed = False
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("bytes") is not None:
                    data: bytes = message["bytes"]
                    if len(data) > MAX_FRAME_BYTES:
                        close_code[0], close_code[1] = 1009, "frame_too_large"
                        break
                    await outbound.put(pb.RelayTunnelRequest(data=data))
                elif message.get("text") == EOF_FRAME:
                    half_closed = True
                    await outbound.put(pb.RelayTunnelRequest(close_write=True))
                elif (text := message.get("text") or "").startswith(ERROR_PREFIX):
                    # The collector could not reach the device: the session ends with its reason now.
                    await outbound.put(pb.RelayTunnelRequest(failed=text.removeprefix(ERROR_PREFIX)[:64]))
                    await outbound.put(None)
                    return
        except (WebSocketDisconnect, RuntimeError):
            pass
        if half_closed and close_code[0] == 1000:
            # It had finished writing: hanging up now ends its stream normally.
            await outbound.put(None)
            return
        # The collector went away mid-stream: abort the relay so the router ends
        # the session with a reason.
        aborted.set()
        call.cancel()

    async def watch_standing() -> None:
        lapsed = await standing_lapsed(state, claims.collector_id)
        # Only the relay loop touches the socket; end it and let it close with 4401.
        close_code[0], close_code[1] = 4401, lapsed
        aborted.set()
        call.cancel()

    close_code: list[Any] = [1000, ""]
    aborted = asyncio.Event()
    channel = aio_channel(record["router"], state.service_token)
    call = tunnel_pb2_grpc.TunnelServiceStub(channel).RelayTunnel(requests())
    reader = asyncio.create_task(from_collector())
    watcher = asyncio.create_task(watch_standing())
    try:
        async for reply in call:
            if reply.WhichOneof("msg") == "data":
                await ws.send_bytes(reply.data)
            elif reply.WhichOneof("msg") == "close_write":
                await ws.send_text(EOF_FRAME)
    except grpc.aio.AioRpcError as exc:
        log.info("tunnel relay ended", session_id=session_id, code=exc.code().name)
    except asyncio.CancelledError:
        if not aborted.is_set():
            raise
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        watcher.cancel()
        reader.cancel()
        await asyncio.gather(reader, watcher, return_exceptions=True)
        # End the request stream and the call before the channel goes: gRPC's task feeding the
        # requests would otherwise be destroyed still waiting for the next one.
        with contextlib.suppress(asyncio.QueueFull):
            outbound.put_nowait(None)
        call.cancel()
        await asyncio.sleep(0)
        await channel.close(None)
        # The collector may be gone already (it hung up first): closing is then a no-op, not an error.
        await close_socket(ws, close_code[0], close_code[1])
