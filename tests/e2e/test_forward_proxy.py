"""A collector behind a plain forward proxy (HTTPS_PROXY, CONNECT): the common corporate egress."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.collector_harness import Collector, Platform, wait_for
from tests.e2e.harness import ControlPlane
from tests.support.squid import ForwardProxy

pytestmark = pytest.mark.timeout(180)


def test_a_collector_enrolls_and_works_through_squid(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    gateway_port = cp.port("gateway")
    with ForwardProxy(tmp_path / "squid") as proxy:
        through = {"HTTPS_PROXY": proxy.url, "https_proxy": proxy.url, "NO_PROXY": "", "no_proxy": ""}
        collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log", env=through)
        collector.enroll()
        # Enrollment went through the proxy (a connection is logged once it closed).
        wait_for(lambda: proxy.connects(gateway_port) >= 1, timeout=10)
        time.sleep(1)  # the enroll process has exited: let squid log its last tunnel before counting
        enrolled = proxy.connects(gateway_port)
        collector.start()
        platform = Platform(cp)
        try:
            wait_for(lambda: "control socket open" in collector.log(), timeout=30)
            for n in range(3):
                task_id = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": n}, f"proxy-{n}")
                assert platform.wait_state(task_id, {"success", "failed"}).error_code == ""
        finally:
            platform.close()
            collector.stop()
        # The control socket, which carried every claim and report (no per-call HTTPS), crossed the
        # proxy too: one more tunnel than enrollment's. Squid logs each tunnel when it closes.
        assert "using per-call HTTPS" not in collector.log()
        wait_for(lambda: proxy.connects(gateway_port) > enrolled, timeout=10)
