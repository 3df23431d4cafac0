"""A gRPC service's HTTP probes and its systemd readiness notification, over real sockets."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from common.embedded.process import free_port
from common.runtime import sd_notify
from common.telemetry.metrics import MetricsServer

pytestmark = pytest.mark.timeout(30)


def test_readyz_follows_the_serving_state_and_metrics_are_still_served() -> None:
    server = MetricsServer("127.0.0.1", free_port())
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert httpx.get(f"{base}/readyz").status_code == 503  # not serving yet
        server.ready.set()
        reply = httpx.get(f"{base}/readyz")
        assert reply.status_code == 200 and reply.headers["cache-control"] == "no-store"
        server.blocked = "read-only: a standby"  # a failover is under way (common/db/writable.py)
        reply = httpx.get(f"{base}/readyz")
        assert (reply.status_code, reply.text) == (503, "not ready: read-only: a standby\n")
        server.blocked = None
        assert httpx.get(f"{base}/readyz").status_code == 200
        server.ready.clear()  # a graceful stop began
        assert httpx.get(f"{base}/readyz").status_code == 503
        assert "versus_service_up" in httpx.get(f"{base}/metrics").text
    finally:
        server.stop()


def test_readiness_reaches_a_notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sd_notify.ready()
        assert listener.recv(64) == b"READY=1"
        assert sd_notify.stopping()
        assert listener.recv(64) == b"STOPPING=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sd_notify.ready()
