"""Carrying a tunnel session: connect to the device, dial back the gateway, relay bytes both ways.

Tunnels to a destination configured for local credential injection are
served by collector/tunnel_inject.py instead of relayed raw. Binary WebSocket
frames carry bytes; the text frame ``eof`` closes one
direction (half-close), mirrored onto the TCP connection with ``write_eof``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping
from typing import Any

import websockets

from collector.tunnel_inject import HttpInjector, injector_for
from common.telemetry.logs import get_logger

CHUNK_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
EOF_FRAME = "eof"
UNREACHABLE_FRAME = "error:target_unreachable"

log = get_logger("versus.collector.tunnel")


def dial_back_path(session_id: str) -> str:
    """The path (with query) of a tunnel's dial-back: the bearer token is bound to exactly this."""
    return f"/api/collector/v1/tunnel?session={session_id}"


async def _dial_back(session_id: str, gateway_url: str, context: ssl.SSLContext, bearer: str) -> Any:
    url = "wss://" + gateway_url.split("://", 1)[1].rstrip("/") + dial_back_path(session_id)
    try:
        return await websockets.connect(
            url, ssl=context, additional_headers={"Authorization": f"Bearer {bearer}"},
            max_size=CHUNK_BYTES + 1024, compression=None, open_timeout=CONNECT_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, websockets.WebSocketException, TimeoutError) as exc:
        log.warning("tunnel dial-back failed", session_id=session_id, reason=str(exc))
        return None


async def _carry_injected(injector: HttpInjector, session_id: str, ws: Any) -> None:
    async def receive() -> bytes | None:
        try:
            while True:
                message = await ws.recv()
                if isinstance(message, bytes):
                    return message
                if message == EOF_FRAME:
                    return None
        except websockets.ConnectionClosed:
            return None

    async def send(data: bytes) -> None:
        for start in range(0, len(data), CHUNK_BYTES):
            await ws.send(data[start : start + CHUNK_BYTES])

    log.info("tunnel open", session_id=session_id, inject="http")
    try:
        await injector.serve(receive, send)
        await ws.send(EOF_FRAME)
    except (OSError, websockets.WebSocketException):
        pass
    finally:
        await ws.close()
        log.info("tunnel closed", session_id=session_id)


async def carry(
    offer: dict[str, Any],
    gateway_url: str,
    context: ssl.SSLContext,
    bearer: str,
    credentials: Mapping[str, Any] | None = None,
) -> None:
    """Carry one offered tunnel: a raw byte relay, or local credential injection if configured.

    ``bearer`` is a token bound to ``GET`` :func:`dial_back_path` of this session; it is used once.
    """
    session_id = str(offer["session_id"])
    try:
        injector = injector_for(str(offer["host"]), int(offer["port"]), credentials or {})
    except ValueError as exc:
        log.warning("tunnel refused: bad local injection settings", session_id=session_id, reason=str(exc))
        return
    if injector is not None:
        ws = await _dial_back(session_id, gateway_url, context, bearer)
        if ws is not None:
            await _carry_injected(injector, session_id, ws)
        return
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(str(offer["host"]), int(offer["port"]))
    except (OSError, TimeoutError) as exc:
        log.warning("tunnel target unreachable", session_id=session_id, reason=str(exc) or type(exc).__name__)
        # Say so at once: the platform would otherwise wait for a dial-back that never comes.
        ws = await _dial_back(session_id, gateway_url, context, bearer)
        if ws is not None:
            with contextlib.suppress(OSError, websockets.WebSocketException):
                await ws.send(UNREACHABLE_FRAME)
            await ws.close()
        return
    ws = await _dial_back(session_id, gateway_url, context, bearer)
    if ws is None:
        writer.close()
        return
    log.info("tunnel open", session_id=session_id)
    try:
        await _relay(reader, writer, ws)
    finally:
        await ws.close()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        log.info("tunnel closed", session_id=session_id)


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws: Any) -> None:
    """Relay until the session is over, then return (the caller closes both connections).

    Over means: both directions closed (``eof`` each way: a half-close is honoured, the other
    direction may go on), or either connection is gone — the platform's end going away
    closes the gateway socket, and the device connection must not outlive it (a device has
    few sessions to spare), nor the socket a device that hung up.
    """

    async def device_to_gateway() -> None:
        with contextlib.suppress(OSError, websockets.WebSocketException):
            while data := await reader.read(CHUNK_BYTES):
                await ws.send(data)
            await ws.send(EOF_FRAME)

    async def gateway_to_device() -> bool:
        """True when the platform half-closed (``eof``); False when the socket is gone."""
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    writer.write(message)
                    await writer.drain()
                elif message == EOF_FRAME:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return True
        except (OSError, websockets.WebSocketException):
            pass
        return False

    upstream = asyncio.ensure_future(device_to_gateway())
    downstream = asyncio.ensure_future(gateway_to_device())
    gone = asyncio.ensure_future(ws.wait_closed())
    try:
        done, _ = await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        if downstream in done and downstream.result() and not upstream.done():
            # The platform is done sending: the device may still answer until it closes.
            await asyncio.wait({upstream, gone}, return_when=asyncio.FIRST_COMPLETED)
        elif upstream in done and not downstream.done():
            # The device is done sending: the platform may still send until it half-closes
            # (a device that closed completely fails the next write, which ends it too).
            await asyncio.wait({downstream, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (upstream, downstream, gone):
            task.cancel()
        await asyncio.gather(upstream, downstream, gone, return_exceptions=True)
