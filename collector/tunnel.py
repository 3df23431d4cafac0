"""Carrying a tunnel session: connect to the device, dial back the gateway, relay bytes both ways.

Binary WebSocket frames carry bytes; the text frame ``eof`` closes one
direction (half-close), mirrored onto the TCP connection with ``write_eof``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import websockets

from common.logs import get_logger

CHUNK_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
EOF_FRAME = "eof"

log = get_logger("versus.collector.tunnel")


async def carry(offer: dict[str, Any], gateway_url: str, context: ssl.SSLContext, bearer: str) -> None:
    session_id = str(offer["session_id"])
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(str(offer["host"]), int(offer["port"])), CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        log.warning("tunnel target unreachable", session_id=session_id, reason=str(exc))
        return
    url = (
        "wss://"
        + gateway_url.split("://", 1)[1].rstrip("/")
        + f"/api/collector/v1/tunnel?session={session_id}"
    )
    try:
        ws = await websockets.connect(
            url, ssl=context, additional_headers={"Authorization": f"Bearer {bearer}"},
            max_size=CHUNK_BYTES + 1024, compression=None, open_timeout=CONNECT_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, websockets.WebSocketException, TimeoutError) as exc:
        log.warning("tunnel dial-back failed", session_id=session_id, reason=str(exc))
        writer.close()
        return
    log.info("tunnel open", session_id=session_id)

    async def device_to_gateway() -> None:
        while data := await reader.read(CHUNK_BYTES):
            await ws.send(data)
        await ws.send(EOF_FRAME)

    async def gateway_to_device() -> None:
        async for message in ws:
            if isinstance(message, bytes):
                writer.write(message)
                await writer.drain()
            elif message == EOF_FRAME and writer.can_write_eof():
                writer.write_eof()
                return

    try:
        await asyncio.gather(device_to_gateway(), gateway_to_device())
    except (OSError, websockets.WebSocketException):
        pass
    finally:
        await ws.close()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        log.info("tunnel closed", session_id=session_id)
