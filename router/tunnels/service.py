"""``TunnelService/OpenTunnel``: a platform's request for a byte tunnel to a device.

The router decides here: the target's shape, the caller's tenant scope and role (RBAC), the
collector that carries it (placement); then it offers the session and waits for the gateway that
takes the collector's dial-back (router/tunnels/broker.py). A caller that asked for ``direct``
attachment gets that gateway's attach URL and a single-use ticket in ``ready`` and the stream
ends: its bytes then flow platform ↔ gateway ↔ collector (common/tunnel/attach.py). For a caller
that did not ask, the router attaches to the gateway itself with the ticket and carries the bytes
on this stream, as before direct attachment existed. Refusals and endings keep their codes either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import websockets
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc

from common.access import rbac
from common.errors import InvalidArgument
from common.grpc.server import Context
from common.telemetry.logs import get_logger
from common.tunnel import frames
from common.tunnel.attach import MAX_FRAME_BYTES, attach, end_reason
from router.tunnels.broker import Offered, TunnelHub

log = get_logger("versus.router.tunnels")

# (collector_id, site_id, tenant_id, may_see_tenant) -> the collector that will carry the tunnel.
PickCollector = Callable[[str, str, str, Callable[[str], bool]], Awaitable[str]]


class TunnelServicer(tunnel_pb2_grpc.TunnelServiceServicer):
    def __init__(self, hub: TunnelHub, pick_collector: PickCollector):
        self.hub = hub
        self.pick_collector = pick_collector

    async def OpenTunnel(
        self, request_iterator: AsyncIterator[pb.OpenTunnelRequest], context: Context
    ) -> AsyncIterator[pb.OpenTunnelResponse]:
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("msg") != "open":
            raise InvalidArgument("the first message must be `open`", code="tunnel_open_missing")
        target = first.open
        if not target.host or len(target.host) > 255 or not 0 < target.port < 65536:
            raise InvalidArgument("host and a port in 1-65535 are required", code="tunnel_target_invalid")
        if target.tenant_id:
            rbac.require_tenant(target.tenant_id)
        collector_id = await self.pick_collector(
            target.collector_id, target.site_id, target.tenant_id, rbac.sees_tenant
        )
        offered, held = await self.hub.open(collector_id, target.host, target.port, target.direct)
        if held is None or held.failed:
            reason = held.failed if held is not None else "collector_did_not_connect"
            yield pb.OpenTunnelResponse(closed=pb.TunnelClosed(reason=reason))
            return
        ready = pb.TunnelReady(session_id=offered.session_id, collector_id=collector_id)
        if target.direct:
            ready.attach_url, ready.ticket = held.gateway, offered.ticket
            yield pb.OpenTunnelResponse(ready=ready)
            return
        yield pb.OpenTunnelResponse(ready=ready)
        async for reply in _carry(request_iterator, offered, held.gateway):
            yield reply


async def _carry(
    requests: AsyncIterator[pb.OpenTunnelRequest], offered: Offered, url: str
) -> AsyncIterator[pb.OpenTunnelResponse]:
    """Attach to the gateway on the platform's behalf and carry its stream both ways."""
    try:
        ws = await attach(url, offered.ticket)
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        log.warning("tunnel attach failed", session_id=offered.session_id, reason=str(exc))
        yield pb.OpenTunnelResponse(closed=pb.TunnelClosed(reason="gateway_gone"))
        return

    async def toward_gateway() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for request in requests:
                kind = request.WhichOneof("msg")
                if kind == "data":
                    # gRPC takes messages up to 16 MiB; the attach socket, frames up to 1 MiB.
                    for start in range(0, len(request.data), MAX_FRAME_BYTES):
                        await ws.send(request.data[start : start + MAX_FRAME_BYTES])
                elif kind == "close_write":
                    await ws.send(frames.EOF)
                    return
            # The platform's stream ended without a half-close: it went away.
            await ws.close(1000, "platform_gone")

    pumping = asyncio.create_task(toward_gateway())
    try:
        async for message in ws:
            if isinstance(message, bytes):
                yield pb.OpenTunnelResponse(data=message)
            elif message == frames.EOF:
                yield pb.OpenTunnelResponse(close_write=True)
    except websockets.ConnectionClosed:
        pass  # the reason is in the close frame, if one came
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pumping
        await ws.close()
    yield pb.OpenTunnelResponse(closed=pb.TunnelClosed(reason=end_reason(ws)))
