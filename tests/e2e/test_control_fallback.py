"""Losing the WebSocket control channel mid-claim: the collector goes on over HTTPS, then returns to WSS."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from versus.router.v1 import task_pb2

from tests.e2e.collector_harness import Collector, Platform, wait_for
from tests.e2e.harness import ControlPlane
from tests.support.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.timeout(180)
WS_RETRY_S = 3
RECONCILABLE = "mutate_reconcilable"


def _final(platform: Platform, task_id: str) -> str:
    task = platform.wait_state(task_id, {"success", "failed", "indeterminate", "expired"})
    return str(task_pb2.TaskState.Name(task.state))


def test_dropped_control_socket_falls_back_without_losing_or_repeating_work(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    # Route the collector through a proxy the test can cut (TLS passes through untouched).
    proxy = CuttableProxy(cp.port("gateway"))
    collector.use_gateway(f"https://localhost:{proxy.port}")
    platform = Platform(cp)
    try:
        collector.start("--ws-retry", str(WS_RETRY_S))
        wait_for(lambda: "control socket open" in collector.log())
        time.sleep(0.5)  # the collector is now holding a claim on the socket
        assert proxy.cut() >= 1
        tasks = [
            platform.submit(collector.site_id, "append", RECONCILABLE, f"dev-{i}", {"n": i}, f"drop-{i}")
            for i in range(5)
        ]
        for task_id in tasks:
            assert _final(platform, task_id) == "TASK_STATE_SUCCESS"
        log = collector.log()
        assert "control socket lost; using per-call HTTPS" in log
        for i in range(5):
            assert len(collector.device(f"dev-{i}")) == 1  # applied exactly once
        # After the retry period the collector is back on the socket and work still flows.
        wait_for(lambda: collector.log().count("control socket open") >= 2, timeout=WS_RETRY_S + 30)
        last = platform.submit(collector.site_id, "append", RECONCILABLE, "dev-last", {}, "drop-last")
        assert _final(platform, last) == "TASK_STATE_SUCCESS"
        assert len(collector.device("dev-last")) == 1
    finally:
        collector.stop()
        platform.close()
        proxy.close()
