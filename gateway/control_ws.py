"""The control channel over a WebSocket: ``wss://<gateway>/api/collector/v1/control``.

Same operations and semantics as the per-call HTTPS endpoints, as typed JSON text frames
(gateway/control_frames.py reads and writes them; docs/protocol.md is the contract). The gateway
only answers frames the collector sent; it never pushes unrequested work.

``v`` is the protocol version the frame is written in (common/protocol.py): any version the
gateway speaks is read, and the answer is written in the same one; a claim's body offers the
collector's range and its answer names the settled version. A frame in a version the gateway does
not speak is answered with ``version_unsupported`` (its details give the range spoken here) and
the socket is closed with 4400 and that code.

``body`` is exactly the HTTPS request or response body; a 204 has ``null``. A result may carry
``headers``: the HTTPS answer's ``X-Versus-*`` headers (a 204 claim's server time and hold).
Each frame carries its own bearer token in ``auth``, bound (``htm`` FRAME, ``htu`` the
operation's HTTPS path, ``bsh`` the SHA-256 of the body: from protocol 7 of the UTF-8 bytes of
the body's text as sent, before it of ``collector_jwt.frame_body`` of the body object) and
accepted once, exactly as an HTTPS call's: whoever sits on the TLS path can neither inject,
replay nor alter a frame. A frame whose token is refused is answered with the refusal (401, its
code) and the socket stays open.

The bearer token is also checked at the upgrade, and the collector's standing is re-read from
PostgreSQL on a frame whose replay check finds the flag a revocation sets
(common/redis/revocations.py), or once the certificate known at the upgrade has ended, and when
the revocation broadcast or the periodic sweep names the collector (gateway/standing.py): a
revoked (or expired) collector's socket closes with 4401, and an ordinary frame costs no
database read.

**No task while idle.** A socket is served by its protocol object (gateway/control_socket.py)
and one :class:`ControlSession`, with no ASGI application, no task and no Redis subscription of
its own: each frame gets a task for as long as it is answered (a claim's is parked for its hold),
and the revocation broadcast calls back into the session. The memory of a parked collector is
its TLS connection, these two objects and its claim (docs/benchmarks.md, "Idle fleet").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any, Protocol

from common import error_mapping, protocol
from common.errors import InvalidArgument, PayloadTooLarge, ResourceExhausted, VersusError
from common.redis.fanout import CallbackWake
from common.telemetry.logs import get_logger, new_request_id
from common.trust import collector_jwt
from common.trust.collector_jwt import BearerError
from gateway import replay
from gateway.collector_api import OPERATIONS
from gateway.control_call import ControlCall
from gateway.control_frames import error_reply, frame_id_of, parse_frame, result_frame
from gateway.metrics import AUTH_FAILURES, CONTROL_SOCKETS
from gateway.standing import lapsed_standing
from gateway.store import CollectorAuthRecord

MAX_IN_FLIGHT = 16
CONTROL_PATH = "/api/collector/v1/control"
# Close codes: a frame that cannot be read; the collector lost its standing.
CLOSE_MALFORMED = 4400
CLOSE_STANDING = 4401

log = get_logger("versus.gateway.control")


class SocketLink(Protocol):
    """What a session needs of its socket (gateway/control_socket.py)."""

    def write_text(self, text: str) -> None:
        """Send a frame now; a peer that does not read is cut off past the output bound."""

    async def send_text(self, text: str) -> None:
        """Send a frame once the peer has taken what was written before (nothing if closed)."""

    def close_now(self, code: int, reason: str) -> None:
        """Start the closing handshake with ``code`` (nothing if closing already)."""

    def heard_at(self) -> float:
        """When the peer last sent anything (monotonic seconds; the gateway's pings get pongs)."""


class ControlSession:
    """One admitted control socket: its frames answered, its collector's standing watched."""

    __slots__ = ("_checking", "_closed", "_link", "_record", "_state", "_wake", "_work")

    def __init__(self, state: Any, record: CollectorAuthRecord, link: SocketLink) -> None:
        self._state = state
        self._record = record
        self._link = link
        self._work: set[asyncio.Task[None]] = set()
        self._closed = False
        self._checking = False
        # The revocation broadcast (and the periodic sweep) for this collector calls back here.
        self._wake = CallbackWake(self._standing_announced)
        state.revocations.register(record.collector_id, self._wake)
        CONTROL_SOCKETS.inc()

    @property
    def collector_id(self) -> str:
        return self._record.collector_id

    def on_message(self, text: str | None) -> None:
        """A whole message from the collector (``None``: a binary one)."""
        if self._closed:
            return
        try:
            frame_id, kind, auth, raw, version = parse_frame(text)
        except protocol.VersionUnsupported as exc:
            # Said legibly, with the range spoken here, before the socket closes.
            self._link.write_text(result_frame(frame_id_of(text), "error", error_reply(exc)))
            self._link.close_now(CLOSE_MALFORMED, exc.code)
            return
        except InvalidArgument as exc:
            self._link.close_now(CLOSE_MALFORMED, exc.code)
            return
        if kind not in OPERATIONS:
            expected = ", ".join(OPERATIONS)
            unknown = InvalidArgument(
                f"unknown frame type {kind!r}; expected {expected}", code="unknown_frame_type"
            )
            self._link.write_text(result_frame(frame_id, kind, error_reply(unknown), version))
            return
        if len(self._work) >= MAX_IN_FLIGHT:
            busy = ResourceExhausted(
                f"at most {MAX_IN_FLIGHT} requests in flight per socket", code="too_many_requests"
            )
            self._link.write_text(result_frame(frame_id, kind, error_reply(busy), version))
            return
        task = asyncio.get_running_loop().create_task(self._answer(frame_id, kind, auth, raw, version))
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    def closed(self) -> None:
        """The connection is gone: what it was waiting for is abandoned."""
        if self._closed:
            return
        self._closed = True
        self._state.revocations.unregister(self.collector_id, self._wake)
        for task in self._work:
            task.cancel()
        CONTROL_SOCKETS.dec()

    async def _answer(self, frame_id: str, kind: str, auth: object, raw: bytes, version: int) -> None:
        state = self._state
        try:
            self._record, changed = await _authenticate_frame(state, self._record, kind, auth, raw)
        except VersusError as exc:
            await self._link.send_text(result_frame(frame_id, kind, error_reply(exc), version))
            return
        # The standing is read again from PostgreSQL when it may have changed: the replay check
        # read the flag a revocation (or renewal) sets, or the kept certificate has ended. So a
        # revocation bites on the next frame, and an ordinary frame costs no database read.
        if changed or self._record.cert_not_after <= dt.datetime.now(dt.UTC):
            try:
                reason = await lapsed_standing(state.store, self.collector_id)
            except Exception as exc:  # a dependency failed: answer this frame 503, keep the socket
                await self._link.send_text(
                    result_frame(frame_id, kind, error_reply(error_mapping.public_error(exc)), version)
                )
                return
            if reason is not None:
                self._link.close_now(CLOSE_STANDING, reason)
                return
        operation, limit = OPERATIONS[kind]
        try:
            if len(raw) > limit:
                raise PayloadTooLarge(f"{kind} body exceeds {limit} bytes", code="body_too_large")
            reply = await operation(
                ControlCall(
                    state, self.collector_id, raw, new_request_id(), "wss", version, self._link.heard_at
                )
            )
        except VersusError as exc:
            reply = error_reply(exc)
        except Exception:
            log.exception("control frame failed", kind=kind)
            reply = error_reply(error_mapping.public_error(RuntimeError()))
        await self._link.send_text(result_frame(frame_id, kind, reply, version))

    def _standing_announced(self) -> None:
        """The broadcast or the sweep named this collector: PostgreSQL decides (one check at a time)."""
        if self._closed or self._checking:
            return
        self._checking = True
        task = asyncio.get_running_loop().create_task(self._check_standing())
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _check_standing(self) -> None:
        try:
            reason = await lapsed_standing(self._state.store, self.collector_id)
        except Exception:  # a dependency failed: keep the socket; the next sweep wakes it again
            log.warning("standing check failed; the next sweep retries", exc_info=True)
            return
        finally:
            self._checking = False
        if reason is not None:
            self._link.close_now(CLOSE_STANDING, reason)


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
        claims.check_request(collector_jwt.FRAME, f"/api/collector/v1/{kind}")
        claims.check_body(raw)
    except BearerError as exc:
        AUTH_FAILURES.labels(exc.code).inc()
        raise
    changed = await replay.accept_once(state.connections.redis, claims, now, changes_state=True)
    return record, changed
