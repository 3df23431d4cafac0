"""The reference collector end to end: `versus-cp up`, `versus-collector enroll` and `run`, real processes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from collector.status import local_status
from common.embedded.process import free_ports
from tests.e2e.collector_harness import Collector, Platform, wait_for
from tests.e2e.harness import ControlPlane, run_cli

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def fleet(shared_control_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[Collector, Platform]]:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    platform = Platform(cp)
    yield collector, platform
    collector.stop()
    platform.close()


def _status(collector: Collector, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector", "status", "--state-dir", str(collector.state), *flags],
        env=collector.cp.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _scrape(port: int) -> str:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.TransportError:
        return ""


def test_echo_task_succeeds_and_sigterm_drains(fleet: tuple[Collector, Platform]) -> None:
    """Also what the collector says about itself meanwhile: its loopback /metrics and `status`."""
    collector, platform = fleet
    (port,) = free_ports(1)
    collector.start("--metrics-port", str(port))
    task_id = platform.submit(collector.site_id, "echo", "read", "dev-1", {"hello": "world"}, "echo-1")
    task = platform.wait_state(task_id, {"success", "failed"})
    assert json.loads(task.result) == {"hello": "world"}
    assert "control socket open" in collector.log()  # the WebSocket is preferred when it works
    # A task in flight when SIGTERM arrives is finished and reported before the collector exits.
    # Long enough for the checks below on a busy machine (the drain grace is 10 s).
    slow = platform.submit(collector.site_id, "echo", "read", "dev-2", {"sleep": 6}, "echo-2")
    platform.wait_state(slow, {"dispatched", "running"})
    wait_for(lambda: 'versus_collector_tasks_in_flight{provider="stub"} 1.0' in _scrape(port), timeout=5)
    scraped = _scrape(port)
    assert (
        'transport="websocket"' in scraped and "versus_collector_cert_expiry_timestamp_seconds 1." in scraped
    )
    # runtime.json is rewritten after each answered claim (every 2 s here).
    wait_for(lambda: local_status(collector.state)["session"]["in_flight"] == {"stub": 1}, timeout=5)
    running = json.loads(_status(collector, "--json").stdout)
    assert running["enrollment"]["status"] == "active" and running["process"]["running"]
    assert running["session"]["transport"] == "websocket" and running["session"]["protocol"] >= 7
    assert running["journal"]["held"] == 1
    assert 89 * 86400 < running["certificate"]["expires_in_s"] <= 90 * 86400 + 600
    assert collector.stop() == 0
    assert platform.wait_state(slow, {"success"}, timeout=10)
    status = _status(collector)
    assert status.returncode == 0, status.stderr
    assert "enrollment: active (the control plane says)" in status.stdout
    assert "process: not running" in status.stdout
    assert f"gateway: https://localhost:{collector.cp.port('gateway')}" in status.stdout
    assert "journal 2 received, 0 held (in flight or not yet reported)" in status.stdout
    # The clock was corrected from a precise round trip (same host: the offset is about zero).
    assert re.search(r"clock: server time = local [+-]0\.\d{3}s \(within 0\.\d{3}s\)", status.stdout)
    # The gateway out of reach: the local facts still answer, and say why the rest does not.
    collector.use_gateway("https://127.0.0.1:9")
    unreachable = json.loads(_status(collector, "--json").stdout)
    assert unreachable["enrollment"]["error"]["code"] == "gateway_unreachable"
    assert unreachable["journal"]["received"] == 2


@pytest.mark.parametrize(
    ("operation", "op_class", "final"),
    [("apply_once", "mutate_terminal", "indeterminate"), ("append", "mutate_reconcilable", "success"),
     ("echo", "read", "success")],
)  # fmt: skip
def test_sigkill_mid_task_never_applies_twice(
    fleet: tuple[Collector, Platform], operation: str, op_class: str, final: str
) -> None:
    collector, platform = fleet
    collector.start()
    target = f"dev-{operation}"
    # Mutations stay "in progress" long enough to be killed; the read's retry should not wait long.
    delay = 3 if op_class == "read" else 30
    task_id = platform.submit(
        collector.site_id, operation, op_class, target, {"sleep": delay}, f"k-{operation}"
    )
    platform.wait_state(task_id, {"dispatched", "running"})
    if op_class != "read":
        wait_for(lambda: len(collector.device(target)) == 1)  # the change landed, no result yet
    else:
        time.sleep(0.5)
    collector.kill()
    collector.start()
    task = platform.wait_state(task_id, {final, "failed", "indeterminate", "success"}, timeout=90)
    assert task.state == platform.wait_state(task_id, {final}).state
    if op_class != "read":
        assert collector.device(target) == [f"k-{operation}"]  # applied exactly once


def test_a_stop_while_a_restart_drains_ends_the_process(
    fleet: tuple[Collector, Platform], tmp_path: Path
) -> None:
    """A collector restarting to apply an operator's change (here vault mode B) first drains its work;
    SIGTERM during that drain is a stop, so the process exits instead of starting itself again (under
    systemd, `systemctl stop` would otherwise find it running until the unit's kill timeout)."""
    collector, platform = fleet
    collector_id = json.loads((collector.state / "identity.json").read_text())["collector_id"]
    collector.start()
    slow = platform.submit(collector.site_id, "echo", "read", "dev-1", {"sleep": 4}, f"drain-{tmp_path.name}")
    platform.wait_state(slow, {"dispatched", "running"})
    switched = run_cli(["collectors", "vault-mode", collector_id, "B"], collector.cp.env)
    assert switched.returncode == 0, switched.stderr
    wait_for(lambda: "draining" in collector.log(), timeout=30)  # restarting, the slow task in flight
    collector.signal(signal.SIGTERM)
    assert collector.proc is not None
    assert collector.proc.wait(30) == 0, collector.log()
    assert collector.log().count("collector started") == 1, collector.log()
    assert platform.wait_state(slow, {"success"}, timeout=10)
