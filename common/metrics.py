"""Prometheus metrics shared by the services.

The gateway exposes ``/metrics`` on its HTTPS port; each gRPC service exposes
``/metrics`` on its own plain-HTTP metrics port (see docs/configuration.md).
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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
    """The plain-HTTP metrics listener of a gRPC service process."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            self._server, self._thread = start_http_server(self.port, addr=self.host)
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {self.host}:{self.port} (metrics): {exc.strerror or exc}"
            ) from None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
