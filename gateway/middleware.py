"""ASGI middleware: request ids, access logs and HTTP metrics for every request; ambiguous framing refused."""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.telemetry.logs import (
    REQUEST_ID_HEADER,
    bind_request_id,
    clean_request_id,
    get_logger,
    unbind_request_id,
)
from common.telemetry.metrics import HTTP_LATENCY, HTTP_REQUESTS
from gateway import edge

log = get_logger("versus.gateway.access")

# Probes and scrapes are polled constantly; logging them would drown everything else.
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class RequestContextMiddleware:
    """Binds ``X-Request-ID`` (or a fresh id) to logs and echoes it; records metrics."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in {"http", "websocket"}:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        request_id = clean_request_id(headers.get(REQUEST_ID_HEADER))
        scope.setdefault("state", {})["request_id"] = request_id
        bind_request_id(request_id)
        started = time.perf_counter()
        status = 500 if scope["type"] == "http" else 101

        # Whether the whole request has been read: only then may an answer close the connection
        # (closing with request bytes unread resets it, and the client may lose the answer).
        body_read = not _has_body(scope)

        async def receive_tracked() -> Message:
            nonlocal body_read
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_read = True
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                extra = [(b"x-request-id", request_id.encode())]
                if body_read and not edge.is_authenticated(scope):
                    # Keep-alive is for collectors: an anonymous connection ends with its answer,
                    # so idle anonymous connections cannot fill the gateway (docs/gateway.md).
                    extra.append((b"connection", b"close"))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        try:
            framing = _ambiguous_framing(scope)
            if framing is not None:
                await _refuse_framing(framing, send_with_id)
            else:
                await self.app(scope, receive_tracked, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = _route_template(scope)
            method = scope.get("method", "WS")
            HTTP_REQUESTS.labels(route, method, str(status)).inc()
            HTTP_LATENCY.labels(route, method).observe(elapsed)
            if scope["path"] not in _QUIET_PATHS:
                log.info(
                    "request",
                    method=method,
                    path=scope["path"],
                    status=status,
                    duration_ms=round(elapsed * 1000, 2),
                )
            unbind_request_id()


def _has_body(scope: Scope) -> bool:
    if scope["type"] != "http":
        return False
    for name, value in scope.get("headers", ()):
        lowered = name.lower()
        if lowered == b"transfer-encoding" or (lowered == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _ambiguous_framing(scope: Scope) -> str | None:
    """Why the request's body framing is ambiguous, or None.

    A request with both ``Content-Length`` and ``Transfer-Encoding``, or several
    ``Content-Length`` headers, is how request smuggling starts: a proxy in front
    may read the body's end differently from this server and hide a second request
    inside the first. The HTTP parser follows ``Transfer-Encoding`` and would keep
    the connection; the gateway refuses such requests and closes it (RFC 9112 6.1).
    """
    if scope["type"] != "http":
        return None
    names = [name.lower() for name, _ in scope.get("headers", ())]
    lengths = names.count(b"content-length")
    if lengths > 1:
        return "more than one Content-Length header"
    if lengths and b"transfer-encoding" in names:
        return "both Content-Length and Transfer-Encoding"
    return None


async def _refuse_framing(reason: str, send: Send) -> None:
    body = json.dumps(
        {"error": {"code": "ambiguous_framing", "message": f"request body framing is ambiguous: {reason}"}}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        # The bytes after this request cannot be trusted to start a new one.
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _route_template(scope: Scope) -> str:
    # Templates, not raw paths, keep metric cardinality bounded.
    route: Any = scope.get("route")
    return str(getattr(route, "path", "unmatched"))
