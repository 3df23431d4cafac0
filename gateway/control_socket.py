"""The gateway's WebSocket protocol: the control socket served without an ASGI application.

Every WebSocket upgrade reaches :class:`CollectorWebSocketProtocol` (uvicorn's sans-I/O protocol
with the edge limits of gateway/edge.py). An upgrade to any other path (the tunnel) runs the
application as uvicorn would. An upgrade to the control path is admitted by a short task — the
same checks and refusals as before (``admit_socket``: no browser origin, the admission gate, the
collector's bearer token) — and is then served by a :class:`gateway.control_ws.ControlSession`
fed straight from the protocol: no ASGI application with its middleware and routing frames, no
receive queue, no task while the socket is idle. That is what a parked collector's socket costs,
at 10,000 of them (docs/benchmarks.md, "Idle fleet").

Writes never wait for a peer that does not read: what the session answers at once (refusals)
counts against the bound on unread output (4408), and the answers of operations wait until the
peer took what was written before.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import unquote

from starlette.websockets import WebSocket
from uvicorn.protocols.utils import ClientDisconnected
from websockets.http11 import Request

from common.telemetry.logs import get_logger
from common.telemetry.metrics import HTTP_LATENCY, HTTP_REQUESTS
from gateway import edge
from gateway.auth import admit_socket
from gateway.control_ws import CONTROL_PATH, ControlSession

log = get_logger("versus.gateway.control")


class _NoQueue:
    """Where uvicorn's protocol puts the events an application would receive, once there is none
    (it still reports the connection's end there)."""

    __slots__ = ()

    def put_nowait(self, _: object) -> None:
        pass


_NO_QUEUE = _NoQueue()


class CollectorWebSocketProtocol(edge.EdgeWebSocketProtocol):
    """uvicorn's WebSocket protocol with the edge limits; the control socket without ASGI."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session: ControlSession | None = None
        self._control = False
        self._opened_at = 0.0
        self._heard_at = time.monotonic()  # when the peer last sent anything (a pong included)

    # The control socket's handshake --------------------------------------------------------

    def handle_connect(self, event: Request) -> None:
        raw_path, _, query = event.path.partition("?")
        if unquote(raw_path) != CONTROL_PATH:
            super().handle_connect(event)  # the tunnel: the application, as uvicorn runs it
            return
        self._control = True
        self._opened_at = time.perf_counter()
        self.request = event
        self.response = self.conn.accept(event)
        self.handshake_initiated = True
        if self.response.status_code != 101:  # not a valid upgrade: websockets' own refusal
            self.handshake_complete = True
            self.close_sent = True
            self.conn.send_response(self.response)
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.transport.close()
            return
        # What the admission reads (headers, client, the app's state), as a WebSocket scope; the
        # denial extension lets a refusal carry the JSON error body (gateway/auth.py).
        self.scope = {
            "type": "websocket",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "root_path": "",
            "path": CONTROL_PATH,
            "raw_path": raw_path.encode("ascii", "replace"),
            "query_string": query.encode("ascii", "replace"),
            "headers": [
                (k.lower().encode("ascii"), v.encode("latin-1")) for k, v in event.headers.raw_items()
            ],
            "client": self.client,
            "server": self.server,
            "scheme": self.scheme,
            "app": self.config.app,
            "state": {},
            "subprotocols": [],
            "extensions": {"websocket.http.response": {}},
        }  # type: ignore[typeddict-unknown-key]
        self.queue.put_nowait({"type": "websocket.connect"})
        task = self.loop.create_task(self._admit())
        task.add_done_callback(self.on_task_complete)
        self.tasks.add(task)

    async def _admit(self) -> None:
        state = self.config.app.state  # type: ignore[union-attr]
        try:
            ws = WebSocket(self.scope, self.receive, self.send)  # type: ignore[arg-type]
            admitted = await admit_socket(ws, state.store)
            if admitted is None:
                return  # refused with an HTTP answer (sent, and the connection closed)
            await ws.accept()
        except ClientDisconnected:
            return
        except Exception:
            log.exception("control socket admission failed")
            self.send_500_response()
            self.transport.close()
            return
        if self.disconnected or self.close_sent:
            return
        _, record = admitted
        self.session = ControlSession(state, record, self)
        self._shed_handshake()

    def _shed_handshake(self) -> None:
        """Drop what only the handshake needed, for as long as the socket stays open: its
        request's headers (emptied in place: websockets' parser keeps the request object itself),
        answer and scope, the receive queue and the application's state."""
        self.request.headers.clear()
        self.request = self.response = None  # type: ignore[assignment]
        self.scope = {"type": "websocket", "path": CONTROL_PATH, "client": self.client}  # type: ignore[typeddict-item]
        self.queue = _NO_QUEUE  # type: ignore[assignment]
        self.app_state = {}

    # Messages ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._heard_at = time.monotonic()
        super().data_received(data)

    def send_receive_event_to_app(self) -> None:
        if not self._control:
            super().send_receive_event_to_app()
            return
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        if self.close_sent or self.session is None:
            # Closing; or a frame before the upgrade was accepted, which no client may send.
            return
        text: str | None = None
        if self.curr_msg_data_type == "text":
            try:
                text = data.decode()
            except UnicodeDecodeError:
                self.close_now(1007, "invalid UTF-8")
                return
        self.session.on_message(text)

    # SocketLink (gateway/control_ws.py) ----------------------------------------------------

    def heard_at(self) -> float:
        return self._heard_at

    def write_text(self, text: str) -> None:
        if self.close_sent or self.transport.is_closing():
            return
        self.conn.send_text(text.encode())
        output = b"".join(self.conn.data_to_send())
        if self.transport.get_write_buffer_size() + len(output) > edge.MAX_WS_WRITE_BUFFER_BYTES:
            self._cut_off(4408, "peer_not_reading")
            return
        self.transport.write(output)

    async def send_text(self, text: str) -> None:
        await self.writable.wait()
        if self.close_sent or self.disconnected or self.transport.is_closing():
            return
        self.conn.send_text(text.encode())
        self.transport.write(b"".join(self.conn.data_to_send()))

    def close_now(self, code: int, reason: str) -> None:
        if self.close_sent or self.transport.is_closing():
            return
        self.conn.send_close(code, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        # The peer's closing frame is awaited (and its other bytes read and dropped) for so long.
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

    # The end -------------------------------------------------------------------------------

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._control:
            return
        if self.session is not None:
            self.session.closed()
        # As the access log and request metrics record every other request (gateway/middleware.py).
        if self.session is not None:
            status = 101
        elif self.initial_response is not None:  # refused by the admission, with its answer
            status = self.initial_response[0]
        elif self.response is not None and self.response.status_code != 101:  # not a valid upgrade
            status = self.response.status_code
        else:  # gone (or failed) before an answer
            status = 499 if self.disconnected else 500
        elapsed = time.perf_counter() - self._opened_at
        HTTP_REQUESTS.labels(CONTROL_PATH, "WS", str(status)).inc()
        HTTP_LATENCY.labels(CONTROL_PATH, "WS").observe(elapsed)
        log.info(
            "request", method="WS", path=CONTROL_PATH, status=status, duration_ms=round(elapsed * 1000, 2)
        )
