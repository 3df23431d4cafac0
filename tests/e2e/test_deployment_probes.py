"""What a load balancer and systemd see of real service processes: probes and a graceful drain."""

from __future__ import annotations

import signal
import ssl
import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.harness import ControlPlane

pytestmark = pytest.mark.timeout(180)


def test_a_draining_gateway_leaves_rotation_before_it_stops_serving(
    start_control_plane: Callable[..., ControlPlane],
) -> None:
    cp = start_control_plane(VERSUS_GATEWAY_DRAIN_S="3")
    for name in ("router", "enrollment"):
        metrics = f"http://127.0.0.1:{cp.port(f'{name}_metrics')}"
        assert httpx.get(f"{metrics}/readyz").status_code == 200, name
        assert httpx.get(f"{metrics}/healthz").text == "ok\n"
    tls = ssl.create_default_context(cafile=str(cp.ca_file))
    with httpx.Client(verify=tls, base_url=cp.gateway_url, timeout=5) as client:
        assert client.get("/readyz").status_code == 200
        [gateway] = [p for p in cp.descendants() if "gateway" in p.cmdline()]
        gateway.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # It still serves, but tells the balancer to send new work elsewhere.
        time.sleep(0.5)
        reply = client.get("/readyz")
        assert reply.status_code == 503 and reply.json()["status"] == "draining"
        assert client.get("/healthz").status_code == 200
        # After the drain window the listener closes.
        while time.monotonic() - signalled < 15:
            try:
                client.get("/healthz")
            except httpx.TransportError:
                break
            time.sleep(0.2)
        stopped_after = time.monotonic() - signalled
    assert 3.0 <= stopped_after < 15, stopped_after
