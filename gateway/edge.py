"""The gateway's edge: uvicorn's HTTP/1.1 and WebSocket protocols with the limits an internet-facing
server needs (docs/gateway.md, "Edge limits").

uvicorn bounds idle time only between requests (keep-alive), so a peer that completes TLS and
then sends nothing, or trickles header bytes, holds a connection — and a file descriptor, and a
slot of the connection limit — for as long as it likes; its own refusals are plain text. This
module adds, per connection:

- a deadline from the connection being made (TLS done) to the first request's headers, and from
  any later request's first byte to its headers (slowloris);
- a cap on connections per source address that have not yet presented a valid collector
  bearer token, so one anonymous client cannot fill the process's connection limit; a
  connection that authenticates stops counting, and an address's cap grows with the collectors
  recently seen from it (gateway/sources.py), so a fleet behind one NAT address fits;
- the global connection limit checked when a connection is made, for WebSocket upgrades too;
- every refusal with the JSON error body and stable code (``common.errors``);
- on WebSockets, a rate limit on the peer's pings and a bound on what waits to be written to a
  peer that does not read (its pongs would otherwise pile up without limit).

The TLS handshake itself is bounded by :data:`TLS_HANDSHAKE_TIMEOUT_S`, and admitted before it
starts, by the gateway's listener (gateway/listener.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.exceptions import InvalidState

from common.telemetry.logs import get_logger
from gateway.metrics import EDGE_REFUSALS
from gateway.sources import SourceCounts, allowance

log = get_logger("versus.gateway.edge")

TLS_HANDSHAKE_TIMEOUT_S = 10.0
# From the connection being made to the first request's headers being complete.
FIRST_REQUEST_TIMEOUT_S = 10.0
# From a later request's first byte to its headers being complete.
HEADER_TIMEOUT_S = 10.0
# Request line plus headers; a larger head is refused with 431 (h11's own default, made explicit).
MAX_HEADER_BYTES = 16 * 1024
# Connections from one source address that have not (yet) authenticated as a collector, before the
# room its recently seen collectors earn it (gateway/sources.py): many collectors may share one NAT
# address and reconnect together.
MAX_ANONYMOUS_PER_SOURCE = 256
# Pings a WebSocket peer may send: a burst, refilled at a steady rate (collectors ping every 20 s).
PING_BURST = 20
PING_RATE_PER_S = 2.0
# Bytes waiting to be written to one WebSocket peer beyond which it is not reading: drop it.
MAX_WS_WRITE_BUFFER_BYTES = 4 * 1024 * 1024
# How long a refused peer has to take the closing frame before the connection is cut.
CLOSE_GRACE_S = 2.0

# Key, in each request scope's ``state``, of the connection's :class:`ConnectionMark`.
CONNECTION_MARK = "versus.connection"


class ConnectionMark:
    """Per-connection flag the app sets once a request on it carried a valid collector bearer."""

    __slots__ = ("_on_authenticated", "authenticated")

    def __init__(self) -> None:
        self.authenticated = False
        self._on_authenticated: Any = None

    def authenticate(self) -> None:
        if not self.authenticated:
            self.authenticated = True
            if self._on_authenticated is not None:
                self._on_authenticated()


def mark_authenticated(scope: Any, collector_id: str) -> None:
    """Record that the connection carrying ``scope`` belongs to ``collector_id``, a collector that
    authenticated (its address earns room for not-yet-authenticated connections: gateway/sources.py)."""
    mark = scope.get("state", {}).get(CONNECTION_MARK)
    if isinstance(mark, ConnectionMark):
        mark.authenticate()
    client = scope.get("client")
    if client and _counts is not None:
        _counts.seen(client[0], collector_id)


def is_authenticated(scope: Any) -> bool:
    mark = scope.get("state", {}).get(CONNECTION_MARK)
    return isinstance(mark, ConnectionMark) and mark.authenticated


# Anonymous connections per source address, across this process.
_anonymous: Counter[str] = Counter()


# Collectors recently seen per address (gateway/sources.py); None: the base cap alone.
_counts: SourceCounts | None = None


def configure(max_anonymous_per_source: int) -> None:
    """Apply the operator's per-source limit (0: none) to connections accepted from now on."""
    global MAX_ANONYMOUS_PER_SOURCE
    MAX_ANONYMOUS_PER_SOURCE = max_anonymous_per_source or 2**62


def count_sources(counts: SourceCounts) -> None:
    """Let each address's recently seen collectors raise its cap (the app's, at its start)."""
    global _counts
    _counts = counts


def stop_counting_sources(counts: SourceCounts) -> None:
    """The app that started ``counts`` is stopping: the base cap alone, unless another app's
    counts took over meanwhile (tests run several apps in one process, one after another)."""
    global _counts
    if _counts is counts:
        _counts = None


def anonymous_count(source: str) -> int:
    return _anonymous[source]


def anonymous_limit(source: str) -> int:
    """Not-yet-authenticated connections ``source`` may hold now (memory only: no I/O)."""
    if MAX_ANONYMOUS_PER_SOURCE >= 2**62:
        return MAX_ANONYMOUS_PER_SOURCE
    earned = _counts.earned.get(source, 0) if _counts is not None else 0
    return allowance(MAX_ANONYMOUS_PER_SOURCE, earned)


def error_response(
    status: int, reason: bytes, code: str, message: str, extra: list[tuple[bytes, bytes]]
) -> bytes:
    """A complete HTTP/1.1 response carrying the JSON error body; the connection closes after it."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = [
        b"HTTP/1.1 %d %s" % (status, reason),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        *(name + b": " + value for name, value in extra),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class EdgeHttpProtocol(H11Protocol):
    """uvicorn's h11 protocol with the edge limits of this module."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.mark = ConnectionMark()
        super().__init__(config, server_state, {**app_state, CONNECTION_MARK: self.mark}, _loop)
        # Checked in connection_made, for every connection (uvicorn checks only HTTP requests).
        self.connection_limit = self.limit_concurrency
        self.limit_concurrency = None
        self._deadline: asyncio.TimerHandle | None = None
        # Answered before the request body was read; the rest of the body is being read and dropped.
        self._draining = False
        self._source: str | None = None
        self.mark._on_authenticated = self._release_source

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.connection_limit is not None and len(self.connections) > self.connection_limit:
            message = "the gateway is at its connection limit"
            self._refuse(503, b"Service Unavailable", "gateway_busy", message, [(b"retry-after", b"2")])
            return
        source = self.client[0] if self.client else None
        if source is not None:
            if _anonymous[source] >= anonymous_limit(source):
                message = "too many unauthenticated connections from this address"
                self._refuse(
                    503, b"Service Unavailable", "too_many_connections", message, [(b"retry-after", b"5")]
                )
                return
            _anonymous[source] += 1
            self._source = source
        self._arm(FIRST_REQUEST_TIMEOUT_S)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release_source()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused: nothing more is read
        if self.conn.their_state is h11.IDLE:
            if self._deadline is None:
                self._arm(HEADER_TIMEOUT_S)  # the first byte of a new request
            if self._head_too_large(data):
                self._refuse(431, b"Request Header Fields Too Large", "header_too_large",
                             f"the request line and headers exceed {MAX_HEADER_BYTES} bytes", [])  # fmt: skip
                return
        super().data_received(data)
        if self._draining:
            if self.conn.their_state in (h11.IDLE, h11.DONE):
                self._draining = False  # the rest of the early-answered request has arrived
                self._disarm()
        elif self.conn.their_state is not h11.IDLE:
            self._disarm()  # the headers are complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered before the body was read (413, 408): the rest is read and dropped rather than
            # closing at once, which would reset the connection and lose the answer in the client's
            # buffers — but only for so long.
            self._draining = True
            self._arm(HEADER_TIMEOUT_S)

    def _head_too_large(self, data: bytes) -> bool:
        """Whether the request head being received cannot end within :data:`MAX_HEADER_BYTES`.

        h11 enforces its limit only while a head is incomplete, so a large head that arrives in
        one read would pass; this checks where the head ends, whatever the reads.
        """
        buffered, _ = self.conn.trailing_data
        start = (buffered + data[: MAX_HEADER_BYTES + 4])[: MAX_HEADER_BYTES + 4]
        end = start.find(b"\r\n\r\n")
        return end == -1 and len(start) > MAX_HEADER_BYTES

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        # The WebSocket protocol takes over this connection: this one's accounting ends here.
        self._disarm()
        self._release_source()
        super().handle_websocket_upgrade(event)
        # The mark travels on in the WebSocket protocol's state; without this callback it would
        # keep this protocol (its parser, the upgrade's headers) alive as long as the socket.
        self.mark._on_authenticated = None

    def send_400_response(self, msg: str) -> None:
        buffered, _ = self.conn.trailing_data
        if len(buffered) > MAX_HEADER_BYTES:
            self._refuse(431, b"Request Header Fields Too Large", "header_too_large",
                         f"the request line and headers exceed {MAX_HEADER_BYTES} bytes", [])  # fmt: skip
        else:
            self._refuse(400, b"Bad Request", "http_malformed", "the request is not valid HTTP/1.1", [])

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._deadline_passed)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self._draining:
            EDGE_REFUSALS.labels("body_after_answer").inc()
            self.transport.close()  # already answered
            return
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        buffered, _ = self.conn.trailing_data
        if not buffered:
            EDGE_REFUSALS.labels("idle_before_request").inc()
            self.transport.close()  # nothing was asked: nothing to answer
            return
        self._refuse(408, b"Request Timeout", "header_timeout",
                     f"the request headers did not arrive within {HEADER_TIMEOUT_S:g} s", [])  # fmt: skip

    def _release_source(self) -> None:
        if self._source is not None:
            _anonymous[self._source] -= 1
            if _anonymous[self._source] <= 0:
                del _anonymous[self._source]
            self._source = None

    def _refuse(
        self, status: int, reason: bytes, code: str, message: str, extra: list[tuple[bytes, bytes]]
    ) -> None:
        EDGE_REFUSALS.labels(code).inc()
        self._disarm()
        self.transport.write(error_response(status, reason, code, message, extra))
        self.transport.close()
        # A peer that does not read would keep the closing transport (and its buffer) forever.
        self.loop.call_later(CLOSE_GRACE_S, self.transport.abort)


class EdgeWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with a ping rate limit and a bound on unread output."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._ping_tokens = float(PING_BURST)
        self._ping_at = time.monotonic()
        self._cut = False

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            # A handshake refused with an HTTP answer (a denial response) is finished: without this
            # uvicorn logs "ASGI callable returned without completing handshake" for every refusal.
            self.handshake_complete = True

    def handle_ping(self) -> None:
        if self._cut:
            return  # parsed with the pings that got the peer cut off: the close answers them
        now = time.monotonic()
        self._ping_tokens = min(PING_BURST, self._ping_tokens + (now - self._ping_at) * PING_RATE_PER_S)
        self._ping_at = now
        if self._ping_tokens < 1:
            self._cut_off(4429, "too_many_pings")
            return
        self._ping_tokens -= 1
        # The protocol queued a pong for every ping of the bytes just read (possibly hundreds):
        # they count before they are written, so the bound holds to the byte.
        output = b"".join(self.conn.data_to_send())
        if self.transport.get_write_buffer_size() + len(output) > MAX_WS_WRITE_BUFFER_BYTES:
            self._cut_off(4408, "peer_not_reading")
            return
        self.transport.write(output)

    def data_received(self, data: bytes) -> None:
        if self._cut:
            return  # closing: whatever else the peer sends is not read
        super().data_received(data)

    def _cut_off(self, code: int, reason: str) -> None:
        """Close with ``code`` (best effort: the peer may not be reading) and cut the connection soon."""
        if self._cut:
            return
        self._cut = True
        EDGE_REFUSALS.labels(reason).inc()
        log.warning("websocket peer cut off", reason=reason, client=self.client[0] if self.client else "")
        with contextlib.suppress(InvalidState):  # already closing: the frame is on its way
            self.conn.send_close(code, reason)
            self.transport.write(b"".join(self.conn.data_to_send()))
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code})
        # Closed as uvicorn closes for an application: the closing frame sent, the peer's bytes
        # still read (and dropped, data_received) until it ends the connection or the grace
        # ends. Closing the transport here stopped reading; a peer that kept sending then left
        # unread bytes in this side's socket, the kernel answered the close with a reset, and a
        # reset throws away what it still held for the peer: the closing frame (seen under load).
        self.close_sent = True  # uvicorn writes nothing more, nor closes when the handler returns
        if self.close_timer is not None:
            self.close_timer.cancel()
        self.close_timer = self.loop.call_later(CLOSE_GRACE_S, self.transport.abort)
