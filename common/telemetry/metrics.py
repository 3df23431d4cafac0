"""Prometheus metrics shared by the services.

The gateway exposes ``/metrics`` on its HTTPS port; each gRPC service exposes
``/metrics`` on its own plain-HTTP metrics port (see docs/configuration.md).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from common.errors import StartupError

# Latency buckets sized for RPCs and long-polls (the last buckets catch held claims).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

GRPC_REQUESTS = Counter(
    "versus_grpc_requests_total",
    "gRPC requests handled, by service, method and status code.",
    ["service", "method", "code"],
)
GRPC_LATENCY = Histogram(
    "versus_grpc_request_duration_seconds",
    "gRPC handler latency.",
    ["service", "method"],
    buckets=_BUCKETS,
)
HTTP_REQUESTS = Counter(
    "versus_http_requests_total",
    "HTTP requests handled by the gateway, by route template, method and status.",
    ["route", "method", "status"],
)
HTTP_LATENCY = Histogram(
    "versus_http_request_duration_seconds",
    "Gateway HTTP request latency.",
    ["route", "method"],
    buckets=_BUCKETS,
)
SERVICE_UP = Gauge("versus_service_up", "1 while this service process is serving.", ["service"])


class MetricsServer:
    """The plain-HTTP listener of a gRPC service process: ``/metrics`` for Prometheus, and
    ``/healthz`` (the process runs) and ``/readyz`` (it serves, is not stopping and its database
    takes writes) for systemd units, load balancers and orchestrators that probe over HTTP
    (docs/deployment.md)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        # Set once the gRPC server serves; cleared as soon as a graceful stop begins, so a
        # balancer or a probe stops sending new work before the listener goes.
        self.ready = threading.Event()
        # Why the process cannot do its work although it serves (PostgreSQL has no writable
        # primary during a failover: common/db/writable.py); None when nothing stands in the way.
        self.blocked: str | None = None

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _text(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            blocked = self.blocked
            if self.ready.is_set() and blocked is None:
                return _text(start_response, "200 OK", b"ready\n")
            why = f"not ready: {blocked}\n" if blocked is not None else "not ready\n"
            return _text(start_response, "503 Service Unavailable", why.encode())
        result: Iterable[bytes] = self._metrics(environ, start_response)
        return result

    def start(self) -> None:
        self._metrics = make_wsgi_app()

        class Server(ThreadingWSGIServer):
            daemon_threads = True

        Server.address_family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            self._server = make_server(self.host, self.port, self._app, Server, handler_class=_Quiet)
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {self.host}:{self.port} (metrics): {exc.strerror or exc}"
            ) from None
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.ready.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every second would flood the log; requests are not logged."""


def _text(start_response: Callable[..., Any], status: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")])
    return [body]
