"""The control channel over a WebSocket: ``wss://<gateway>/api/collector/v1/control``.

Same operations and semantics as the per-call HTTPS endpoints, as typed JSON
text frames. The gateway only answers frames the collector sent; it never
pushes unrequested work. Frames:

    collector -> gateway  {"v": N, "id": "<request id>", "type": "claim|report|capabilities|bye",
                           "auth": "<bearer token>", "body": {...}}     (protocol 1-6)
                          {..., "body": "<the body's JSON text>"}      (protocol 7 on)
    gateway -> collector  {"v": N, "id": "<same id>", "type": "<type>.result", "status": 200|204|4xx|5xx,
                           "body": {...} | null}

``v`` is the protocol version the frame is written in (common/protocol.py): any
version the gateway speaks is read, and the answer is written in the same one;
a claim's body offers the collector's range and its answer names the settled
version. A frame in a version the gateway does not speak is answered with
``version_unsupported`` (its details give the range spoken here) and the socket
is closed with 4400 and that code. ``body`` stays the frame's last member.

``body`` is exactly the HTTPS request or response body; a 204 has ``null``.
A result may carry ``headers``: the HTTPS answer's ``X-Versus-*`` headers (a
204 claim's server time and how long it was held).
Each frame carries its own bearer token in ``auth``, bound (``htm`` FRAME, ``htu``
the operation's HTTPS path, ``bsh`` the SHA-256 of the body: from protocol 7 of the
UTF-8 bytes of the body's text as sent, before it of ``collector_jwt.frame_body`` of
the body object) and accepted once, exactly as an HTTPS call's: whoever sits on the
TLS path can neither inject, replay nor alter a frame. A frame whose token is
refused is answered with the refusal (401, its code) and the socket stays open.
The bearer token is also checked at the upgrade, and the collector's standing is
re-read from PostgreSQL on a frame whose replay check finds the flag a revocation
sets (common/redis/revocations.py), or once the certificate known at the upgrade
has ended: the first frame after a revocation (or certificate expiry) closes the
socket with 4401, and an ordinary frame costs no database read. A collector sends a claim frame at least
once per claim hold, so an open socket outlives a revocation by at most one
hold. (Closing from a watchdog task while a read is pending does not reliably
reach the client with uvicorn's sans-I/O WebSocket implementation.)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from common import error_mapping, protocol
from common.errors import InvalidArgument, PayloadTooLarge, ResourceExhausted, VersusError
from common.telemetry.logs import get_logger, new_request_id
from common.trust import collector_jwt
from common.trust.collector_jwt import BearerError
from gateway import replay
from gateway.auth import admit_socket, close_socket
from gateway.collector_api import OPERATIONS
from gateway.control_call import ControlCall, ControlReply
from gateway.metrics import AUTH_FAILURES, CONTROL_SOCKETS
from gateway.standing import lapsed_standing, standing_lapsed
from gateway.store import CollectorAuthRecord

MAX_IN_FLIGHT = 16
FRAME_ID_CHARS = 64

router = APIRouter(prefix="/api/collector/v1")
log = get_logger("versus.gateway.control")


def _frame(request_id: str, kind: str, reply: ControlReply, version: int = 1) -> str:
    body = reply.payload.decode() if reply.payload else "null"
    fields: dict[str, Any] = {"v": version, "id": request_id, "type": f"{kind}.result"}
    fields["status"] = reply.status
    if reply.headers:
        # What the HTTPS answer says in headers (a 204 claim's server time and hold).
        fields["headers"] = reply.headers
    return json.dumps(fields)[:-1] + ',"body":' + body + "}"


def _error(error: VersusError) -> ControlReply:
    status = error_mapping.status_for(error)
    return ControlReply(status.http_status, json.dumps(error.to_dict()).encode())


@router.websocket("/control")
async def control(ws: WebSocket) -> None:
    state = ws.app.state
    admitted = await admit_socket(ws, state.store)
    if admitted is None:
        return
    await ws.accept()
    _, record = admitted
    collector_id = record.collector_id
    send_lock = asyncio.Lock()
    work: set[asyncio.Task[None]] = set()
    CONTROL_SOCKETS.inc()

    async def send(text: str) -> None:
        async with send_lock:
            await ws.send_text(text)

    async def handle(frame_id: str, kind: str, raw: bytes, version: int) -> None:
        operation, limit = OPERATIONS[kind]
        try:
            if len(raw) > limit:
                raise PayloadTooLarge(f"{kind} body exceeds {limit} bytes", code="body_too_large")
            reply = await operation(ControlCall(state, collector_id, raw, new_request_id(), "wss", version))
        except VersusError as exc:
            reply = _error(exc)
        except Exception:
            log.exception("control frame failed", kind=kind)
            reply = _error(error_mapping.public_error(RuntimeError()))
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await send(_frame(frame_id, kind, reply, version))

    lapsed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def watch_standing() -> None:
        # An idle socket sends no frames: a revocation broadcast (or the periodic check) closes it.
        lapsed.set_result(await standing_lapsed(state, collector_id))

    watcher = asyncio.create_task(watch_standing())
    try:
        while True:
            receive: asyncio.Future[Any] = asyncio.ensure_future(ws.receive())
            await asyncio.wait([receive, lapsed], return_when=asyncio.FIRST_COMPLETED)
            if lapsed.done():
                receive.cancel()
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
                    await receive
                async with send_lock:
                    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                        await ws.close(code=4401, reason=lapsed.result())
                return
            try:
                message = receive.result()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                return
            try:
                frame_id, kind, auth, raw, version = _parse(message.get("text"))
            except protocol.VersionUnsupported as exc:
                # Said legibly, with the range spoken here, before the socket closes.
                frame_id = _frame_id(message.get("text"))
                with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                    await send(_frame(frame_id, "error", _error(exc)))
                await close_socket(ws, 4400, exc.code)
                return
            except InvalidArgument as exc:
                await close_socket(ws, 4400, exc.code)
                return
            if kind not in OPERATIONS:
                expected = ", ".join(OPERATIONS)
                unknown = InvalidArgument(
                    f"unknown frame type {kind!r}; expected {expected}", code="unknown_frame_type"
                )
                await send(_frame(frame_id, kind, _error(unknown), version))
                continue
            try:
                record, changed = await _authenticate_frame(state, record, kind, auth, raw)
            except VersusError as exc:
                await send(_frame(frame_id, kind, _error(exc), version))
                continue
            # The standing is read again from PostgreSQL when it may have changed: the replay check
            # read the flag a revocation (or renewal) sets, or the kept certificate has ended. So a
            # revocation bites on the next frame, and an idle frame costs no database read.
            if changed or record.cert_not_after <= dt.datetime.now(dt.UTC):
                try:
                    reason = await lapsed_standing(state.store, collector_id)
                except Exception as exc:  # a dependency failed: answer this frame 503, keep the socket
                    await send(_frame(frame_id, kind, _error(error_mapping.public_error(exc)), version))
                    continue
                if reason is not None:
                    await close_socket(ws, 4401, reason)
                    return
            if len(work) >= MAX_IN_FLIGHT:
                busy = ResourceExhausted(
                    f"at most {MAX_IN_FLIGHT} requests in flight per socket", code="too_many_requests"
                )
                await send(_frame(frame_id, kind, _error(busy), version))
                continue
            task = asyncio.create_task(handle(frame_id, kind, raw, version))
            work.add(task)
            task.add_done_callback(work.discard)
    finally:
        watcher.cancel()
        for task in list(work):
            task.cancel()
        await asyncio.gather(watcher, *work, return_exceptions=True)
        CONTROL_SOCKETS.dec()


async def _authenticate_frame(
    state: Any, record: CollectorAuthRecord, kind: str, auth: object, raw: bytes
) -> tuple[CollectorAuthRecord, bool]:
    """The frame's own token: this collector's key, bound to this operation and body, used once.

    Returns the record whose key verified it (a collector may have renewed with a new key
    since the socket opened, so a signature the admitted key refuses is tried once against
    the key on record now), and whether the collector's standing changed recently (the
    replay check's flag, gateway/replay.py).
    """
    try:
        if not isinstance(auth, str) or not auth:
            raise BearerError("every frame needs its own bearer token in auth", code="bearer_missing")
        now = int(time.time())
        try:
            claims = collector_jwt.verify(auth, record.public_key, now)
        except BearerError as exc:
            fresh = (
                await state.store.collector_auth(record.collector_id)
                if exc.code == "bearer_bad_signature"
                else None
            )
            if fresh is None or fresh.public_key.public_numbers() == record.public_key.public_numbers():
                raise
            record = fresh
            claims = collector_jwt.verify(auth, record.public_key, now)
        if claims.collector_id != record.collector_id:
            raise BearerError("bearer token signature does not verify", code="bearer_bad_signature")
        claims.check_request(collector_jwt.FRAME, f"{router.prefix}/{kind}")
        claims.check_body(raw)
    except BearerError as exc:
        AUTH_FAILURES.labels(exc.code).inc()
        raise
    changed = await replay.accept_once(state.connections.redis, claims, now, changes_state=True)
    return record, changed


def _frame_id(text: str | None) -> str:
    """The id of a frame refused before it was read in full (empty when it has none to echo)."""
    with contextlib.suppress(ValueError, RecursionError, TypeError):
        frame_id = json.loads(text or "").get("id")
        if isinstance(frame_id, str) and 0 < len(frame_id) <= FRAME_ID_CHARS:
            return frame_id
    return ""


def _parse(text: str | None) -> tuple[str, str, object, bytes, int]:
    """Validate the frame envelope; the body's own schema is checked by the operation."""
    if text is None:
        raise InvalidArgument("frames must be text (JSON), not binary", code="malformed_frame")
    try:
        frame: Any = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        raise InvalidArgument("frame is not JSON", code="malformed_frame") from None
    if not isinstance(frame, dict) or "v" not in frame:
        raise InvalidArgument("frames must be objects with a protocol version v", code="malformed_frame")
    version = protocol.check_message(frame["v"])
    frame_id, kind = frame.get("id"), frame.get("type")
    if not isinstance(frame_id, str) or not 0 < len(frame_id) <= FRAME_ID_CHARS or not isinstance(kind, str):
        raise InvalidArgument("frames need a string id (1-64 chars) and type", code="malformed_frame")
    # The operation parses exactly the bytes the frame's token is checked against.
    return frame_id, kind, frame.get("auth"), _body_bytes(frame, version), version


def _body_bytes(frame: dict[str, Any], version: int) -> bytes:
    """The bytes a request frame's token binds and its operation reads.

    From protocol 7 the body is JSON text in a string member, and those are its UTF-8 bytes, as an
    HTTPS body's are (absent: none). Before it, the body is an object, hashed in canonical form."""
    if version >= protocol.FRAME_BODY_AS_TEXT:
        text = frame.get("body", "")
        if not isinstance(text, str):
            raise InvalidArgument(
                f"from protocol {protocol.FRAME_BODY_AS_TEXT} a frame's body is its JSON text, as a string",
                code="malformed_frame",
            )
        try:
            return text.encode()
        except UnicodeEncodeError:  # a lone surrogate escape (\ud800) has no UTF-8 bytes
            raise InvalidArgument("body is not valid Unicode text", code="malformed_frame") from None
    body = frame.get("body", {})
    if not isinstance(body, dict):
        raise InvalidArgument("body must be an object", code="malformed_frame")
    return collector_jwt.frame_body(body)
