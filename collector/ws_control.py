"""The collector's side of the WebSocket control channel (see gateway/control_ws.py for the frames).

Requests are multiplexed on one socket by frame id, so a long-poll claim and
reports travel side by side. A socket that cannot be opened for a reason HTTPS
may not share (:class:`WebSocketBlocked`: a proxy's refusal, a handshake that
does not complete) makes the caller fall back to per-call HTTPS and try the
socket again later; a gateway that is down or shedding load
(:class:`GatewayUnavailable`) is retried on a socket after the caller's backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
import time
from collections.abc import Callable
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from collector.gateway_errors import GatewayUnavailable, retry_after
from collector.request_auth import frame_body

MAX_FRAME_BYTES = 3 * 1024 * 1024
# Close codes a gateway sends when it restarts (1012) or goes away (1001, a drain).
GATEWAY_LEAVING = frozenset({1001, 1012})
# TLS and the upgrade together; longer is taken as a path that breaks WebSockets (HTTPS instead).
OPEN_TIMEOUT_S = 10.0


class WebSocketBlocked(Exception):
    """The socket could not be opened, and HTTPS may still work (a proxy refused or broke the
    upgrade, the handshake timed out, the gateway refused the upgrade with a 4xx)."""


class WsControl:
    """``bearer`` opens the socket (bound to ``GET`` of its path); ``sign_frame(type, bound)`` returns
    the token each frame carries in ``auth``, binding the body's bytes ``bound``
    (:func:`collector.request_auth.frame_body`, :func:`collector.request_auth.frame_token`)."""

    def __init__(
        self,
        url: str,
        context: ssl.SSLContext,
        bearer: str,
        sign_frame: Callable[[str, bytes], str],
    ):
        self.url = url
        self._context = context
        self._bearer = bearer
        self._sign_frame = sign_frame
        self._conn: ClientConnection | None = None
        self._pending: dict[str, asyncio.Future[tuple[int, bytes, dict[str, str]]]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self.opened_at = 0.0
        # Whether the gateway closed the socket saying it restarts or goes away (GATEWAY_LEAVING).
        self.gateway_left = False

    @property
    def lived_s(self) -> float:
        """Seconds since the socket opened."""
        return time.monotonic() - self.opened_at

    @property
    def open(self) -> bool:
        return self._conn is not None and self._reader is not None and not self._reader.done()

    async def connect(self) -> None:
        try:
            self._conn = await websockets.connect(
                self.url,
                ssl=self._context,
                additional_headers={"Authorization": f"Bearer {self._bearer}"},
                max_size=MAX_FRAME_BYTES,
                compression=None,
                open_timeout=OPEN_TIMEOUT_S,
            )
        except websockets.InvalidStatus as exc:
            status = exc.response.status_code
            code = _error_code(exc.response.body)
            if status == 503 and code:
                # The gateway itself is busy or lost a dependency: HTTPS would be answered the same.
                hint = retry_after(exc.response.headers.get("Retry-After"))
                raise GatewayUnavailable(f"control socket: HTTP {status} {code}", hint) from None
            # A 4xx, or a 5xx without the gateway's error body (a proxy's 502, say).
            raise WebSocketBlocked(f"control socket: HTTP {status} {code}".rstrip()) from None
        except (ConnectionRefusedError, ConnectionResetError) as exc:
            # Nothing listens (a gateway restarting), or it shed the connection before TLS.
            raise GatewayUnavailable(f"control socket: {type(exc).__name__}") from None
        except (OSError, websockets.WebSocketException, TimeoutError) as exc:
            raise WebSocketBlocked(f"control socket: {type(exc).__name__}: {exc}") from None
        self.opened_at = time.monotonic()
        self._reader = asyncio.create_task(self._read())

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail_pending("closed")

    async def request(
        self, kind: str, body: dict[str, Any], timeout_s: float, version: int = 1
    ) -> tuple[int, bytes, dict[str, str]]:
        """Send one frame written in protocol ``version``; returns (status, body JSON bytes or b"",
        the frame's headers)."""
        if not self.open or self._conn is None:
            raise GatewayUnavailable("control socket is not open")
        frame_id = str(next(self._ids))
        future: asyncio.Future[tuple[int, bytes, dict[str, str]]] = asyncio.get_running_loop().create_future()
        self._pending[frame_id] = future
        try:
            member, bound = frame_body(version, body)
            auth = self._sign_frame(kind, bound)
            await self._conn.send(
                json.dumps({"v": version, "id": frame_id, "type": kind, "auth": auth, "body": member})
            )
            async with asyncio.timeout(timeout_s):
                return await future
        except (websockets.WebSocketException, OSError, TimeoutError) as exc:
            raise GatewayUnavailable(f"control socket: {type(exc).__name__}") from None
        finally:
            self._pending.pop(frame_id, None)

    async def _read(self) -> None:
        assert self._conn is not None
        try:
            async for message in self._conn:
                frame_id, answer = parse_frame(message if isinstance(message, str) else message.decode())
                future = self._pending.get(frame_id)
                if future is None or future.done():
                    continue
                future.set_result(answer)
        except (websockets.WebSocketException, OSError, ValueError, KeyError, TypeError, RecursionError):
            pass  # a broken or garbled socket: pending calls fail below and the agent falls back
        finally:
            # The code of the gateway's closing frame (1006 when none came: a dropped connection).
            self.gateway_left = self._conn.protocol.close_code in GATEWAY_LEAVING
            self._fail_pending("control socket closed")

    def _fail_pending(self, why: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(GatewayUnavailable(why))


def _error_code(body: bytes | bytearray | None) -> str:
    """The stable code of a gateway's JSON error body (``{"error": {"code": ...}}``), or ""."""
    try:
        code = json.loads(body or b"")["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return ""
    return code if isinstance(code, str) else ""


def parse_frame(text: str) -> tuple[str, tuple[int, bytes, dict[str, str]]]:
    """A gateway frame: its id and (status, body bytes as sent or b"", headers).

    The body is the frame's last member and its bytes are kept as sent (a claim's envelope must
    reach the verifier untouched); members this build does not know are ignored. Raises
    ValueError (or KeyError, TypeError) for a frame that is not one.
    """
    frame = json.loads(text)
    if not isinstance(frame, dict):
        raise ValueError("control frame is not an object")
    marker = '"body":'
    raw = text[text.index(marker) + len(marker) : -1].encode() if frame.get("body") is not None else b""
    headers = frame.get("headers")
    headers = {str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {}
    return str(frame.get("id")), (int(frame["status"]), raw, headers)
