"""ASGI middleware: request ids, access logs and HTTP metrics for every request."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.logs import REQUEST_ID_HEADER, bind_request_id, clean_request_id, get_logger, unbind_request_id
from common.metrics import HTTP_LATENCY, HTTP_REQUESTS

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

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
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


def _route_template(scope: Scope) -> str:
    # Templates, not raw paths, keep metric cardinality bounded.
    route: Any = scope.get("route")
    return str(getattr(route, "path", "unmatched"))
