"""Carrying a tunnel session: connect to the device, dial back the gateway, relay bytes both ways,
and dial back again if the socket drops.

The dial-back offers tunnel protocol 2 (``&v=2``); the gateway answers with the version the leg
speaks (``x-versus-tunnel-protocol``, absent from gateways before protocol 2: 1). Protocol 2
moves frames of up to 1 MiB, acknowledges what the device side took, and survives a dropped
socket: the collector dials back within the resume window (common/tunnel/end.py
``RESUME_WINDOW_S``) and both ends resend what the other had not received. A refusal of a re-dial
(``gateway_gone``: the gateway that held the session is gone) ends the session at once.

Tunnels to a destination configured for local credential injection are served by
collector/tunnel_inject.py instead of relayed raw, on protocol 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import websockets
from websockets.exceptions import InvalidStatus

from collector.tunnel_inject import HttpInjector, injector_for
from common.telemetry.logs import get_logger
from common.tunnel import frames
from common.tunnel.end import RESUME_WINDOW_S, LegClosed, SessionEnded, TunnelEnd

CHUNK_BYTES = 64 * 1024  # protocol 1, and the injected path
DEVICE_READ_BYTES = 1024 * 1024
# The device connection's read buffer: reading pauses past twice this (asyncio's StreamReader).
DEVICE_BUFFER_BYTES = 256 * 1024
CONNECT_TIMEOUT_S = 10.0
DEVICE_CLOSE_WAIT_S = 2.0
EOF_FRAME = frames.EOF
UNREACHABLE_FRAME = frames.error("target_unreachable")
PROTOCOL_HEADER = "x-versus-tunnel-protocol"
# Between re-dials of a dropped session (the last one repeats until the resume window closes).
REDIAL_DELAYS_S = (0.0, 0.2, 0.5, 1.0, 2.0)

# A path -> a bearer token bound to ``GET`` that path (each dial-back uses a fresh one).
Bearer = Callable[[str], str]

log = get_logger("versus.collector.tunnel")


def dial_back_path(session_id: str, version: int = frames.V2) -> str:
    """The path (with query) of a tunnel's dial-back: the bearer token is bound to exactly this."""
    return f"/api/collector/v1/tunnel?session={session_id}&v={version}"


class _Refused(Exception):
    """The gateway refused the dial-back (the session is unknown to it, or over)."""


async def _dial_back(
    session_id: str, gateway_url: str, context: ssl.SSLContext, bearer: Bearer, version: int = frames.V2
) -> tuple[Any, int]:
    """An open socket and the protocol it speaks; raises :class:`_Refused` or ``OSError``."""
    path = dial_back_path(session_id, version)
    url = "wss://" + gateway_url.split("://", 1)[1].rstrip("/") + path
    try:
        ws = await websockets.connect(
            url, ssl=context, additional_headers={"Authorization": f"Bearer {bearer(path)}"},
            max_size=frames.MAX_FRAME_BYTES[version] + 1024, max_queue=4, compression=None,
            open_timeout=CONNECT_TIMEOUT_S,
        )  # fmt: skip
    except InvalidStatus as exc:
        raise _Refused(str(exc)) from None
    except (websockets.WebSocketException, TimeoutError) as exc:
        raise OSError(str(exc) or type(exc).__name__) from None
    spoken = ws.response.headers.get(PROTOCOL_HEADER, "1") if ws.response is not None else "1"
    return ws, min(version, int(spoken) if spoken.isdigit() else frames.V1)


class ClientLeg:
    """A tunnel leg over the collector's ``websockets`` connection."""

    def __init__(self, ws: Any):
        self.ws = ws

    async def send(self, message: bytes | str) -> None:
        try:
            await self.ws.send(message)
        except websockets.ConnectionClosed as exc:
            raise _closed(exc) from None
        except OSError:
            raise LegClosed() from None

    async def receive(self) -> bytes | str:
        try:
            message: bytes | str = await self.ws.recv()
        except websockets.ConnectionClosed as exc:
            raise _closed(exc) from None
        except OSError:
            raise LegClosed() from None
        return message


def _closed(exc: websockets.ConnectionClosed) -> LegClosed:
    received = exc.rcvd
    if received is None:
        return LegClosed()
    return LegClosed(clean=received.code == 1000, reason=received.reason)


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
    bearer: Bearer,
    credentials: Mapping[str, Any] | None = None,
) -> None:
    """Carry one offered tunnel: a raw byte relay, or local credential injection if configured."""
    session_id = str(offer["session_id"])
    try:
        injector = injector_for(str(offer["host"]), int(offer["port"]), credentials or {})
    except ValueError as exc:
        log.warning("tunnel refused: bad local injection settings", session_id=session_id, reason=str(exc))
        return
    if injector is not None:
        with contextlib.suppress(_Refused, OSError):
            ws, _ = await _dial_back(session_id, gateway_url, context, bearer, frames.V1)
            await _carry_injected(injector, session_id, ws)
        return
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(
                str(offer["host"]), int(offer["port"]), limit=DEVICE_BUFFER_BYTES
            )
    except (OSError, TimeoutError) as exc:
        log.warning("tunnel target unreachable", session_id=session_id, reason=str(exc) or type(exc).__name__)
        # Say so at once (the first frame, in either protocol): the platform would otherwise
        # wait for a dial-back that never comes.
        with contextlib.suppress(_Refused, OSError, websockets.WebSocketException):
            ws, _ = await _dial_back(session_id, gateway_url, context, bearer)
            await ws.send(UNREACHABLE_FRAME)
            await ws.close()
        return
    try:
        ws, version = await _dial_back(session_id, gateway_url, context, bearer)
    except (_Refused, OSError) as exc:
        log.warning("tunnel dial-back failed", session_id=session_id, reason=str(exc))
        writer.close()
        return
    end = TunnelEnd(version)
    log.info("tunnel open", session_id=session_id, protocol=version)
    device = [
        asyncio.create_task(_device_to_end(reader, end)),
        asyncio.create_task(_end_to_device(writer, end)),
    ]
    try:
        await _carry_legs(end, ws, lambda: _redial(session_id, gateway_url, context, bearer))
    finally:
        end.end(end.reason or "collector_stopped")
        writer.close()
        for task in device:
            task.cancel()
        await asyncio.gather(*device, return_exceptions=True)
        await _close_device(writer)
        log.info("tunnel closed", session_id=session_id, reason=end.reason, legs=end.legs)


async def _carry_legs(end: TunnelEnd, ws: Any, redial: Callable[[], Any]) -> None:
    """Carry the session over ``ws`` and, while it may resume, over the sockets of re-dials."""
    while True:
        broke = await end.run_leg(ClientLeg(ws))
        if broke is None:  # the session is over: tell the gateway why, if it does not know
            await ws.close(1000, end.reason if frames.is_reason(end.reason) else "")
            return
        await ws.close()
        if broke.clean or end.version < frames.V2:
            end.end(broke.reason if broke.clean and frames.is_reason(broke.reason) else "gateway_gone")
            return
        log.info("tunnel socket dropped; dialling back", reason=str(broke))
        try:
            ws = await redial()
        except _Refused:
            end.end("gateway_gone")  # the gateway that held the session is gone (or it is over)
            return
        if ws is None:
            end.end("gateway_unreachable")  # no gateway answered within the resume window
            return


async def _redial(session_id: str, gateway_url: str, context: ssl.SSLContext, bearer: Bearer) -> Any:
    """A new socket for a dropped session within the resume window, or None (too late, or a
    gateway that cannot resume); raises :class:`_Refused` when the gateway refuses the session."""
    deadline = time.monotonic() + RESUME_WINDOW_S
    for attempt in range(1_000_000):
        await asyncio.sleep(REDIAL_DELAYS_S[min(attempt, len(REDIAL_DELAYS_S) - 1)])
        if time.monotonic() >= deadline:
            return None
        try:
            ws, version = await _dial_back(session_id, gateway_url, context, bearer)
        except _Refused as exc:
            log.info("tunnel resume refused", session_id=session_id, reason=str(exc))
            raise
        except OSError:
            continue
        if version < frames.V2:  # a gateway that cannot resume: nothing to pick up there
            await ws.close()
            return None
        return ws
    return None


async def _close_device(writer: asyncio.StreamWriter) -> None:
    """Wait for the device connection to close; one whose device stopped reading (bytes still
    unsent) is reset instead of waited for: it must not outlive the session."""
    try:
        async with asyncio.timeout(DEVICE_CLOSE_WAIT_S):
            await writer.wait_closed()
    except TimeoutError:
        writer.transport.abort()
    except OSError:
        pass


async def _device_to_end(reader: asyncio.StreamReader, end: TunnelEnd) -> None:
    """The device's bytes toward the platform; its end of stream is the half-close."""
    try:
        while data := await reader.read(DEVICE_READ_BYTES):
            await end.write(data)
        end.write_eof()
    except SessionEnded:
        pass
    except OSError:
        end.end("device_closed")


async def _end_to_device(writer: asyncio.StreamWriter, end: TunnelEnd) -> None:
    """The platform's bytes to the device; its half-close is mirrored with ``write_eof``."""
    try:
        while (chunk := await end.read()) is not None:
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except SessionEnded:
        pass
    except OSError:
        end.end("device_closed")
