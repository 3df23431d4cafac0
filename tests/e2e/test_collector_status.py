"""A collector reports on itself: ``versus-collector status`` (text and ``--json``), with the gateway
up and with it unreachable, and its loopback ``/metrics`` while it runs."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx

from common.embedded.process import free_ports
from tests.e2e.collector_harness import Collector, Platform, wait_for
from tests.e2e.harness import ControlPlane


def _status(collector: Collector, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*collector.command, "status", "--state-dir", str(collector.state), *flags],
        env=collector._env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_status_and_local_metrics_say_what_the_collector_is_doing(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "self", tmp_path / "self.log")
    collector_id = collector.enroll()
    (port,) = free_ports(1)
    platform = Platform(cp)
    try:
        collector.start("--metrics-port", str(port))
        task = platform.submit(collector.site_id, "echo", "read", "dev-self", {"sleep": 30}, "self-1")
        platform.wait_state(task, {"running", "dispatched"})

        def scraped() -> str:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.TransportError:
                return ""

        wait_for(lambda: 'versus_collector_tasks_in_flight{provider="stub"} 1.0' in scraped())
        text = scraped()
        assert f'collector_id="{collector_id}"' in text and 'transport="websocket"' in text
        assert "versus_collector_cert_expiry_timestamp_seconds 1." in text
        # runtime.json is written after each answered claim: the one after the task's hand-out
        # (within the 2 s claim wait) says the task runs.
        wait_for(
            lambda: json.loads(_status(collector, "--json", "--offline").stdout)["session"]["in_flight"] != {}
        )
        done = _status(collector, "--json")
        assert done.returncode == 0, done.stderr
        facts = json.loads(done.stdout)
        assert (facts["collector_id"], facts["site_id"]) == (collector_id, collector.site_id)
        assert facts["enrollment"]["status"] == "active"
        assert facts["process"]["running"] and facts["process"]["alive"]
        session = facts["session"]
        assert session["transport"] == "websocket" and session["protocol"] >= 7 and session["session_id"]
        assert session["in_flight"] == {"stub": 1}
        assert facts["journal"]["held"] == 1
        assert 89 * 86400 < facts["certificate"]["expires_in_s"] <= 90 * 86400 + 600
        assert facts["update"] == {}
        text_out = _status(collector).stdout
        assert f"{collector_id} in site {collector.site_id}" in text_out
        assert "enrollment: active (the control plane says)" in text_out
        assert "tasks: running stub 1;" in text_out
    finally:
        platform.close()
        collector.stop()
    # Stopped, and the gateway out of reach: the local facts still answer, and say so.
    identity_path = collector.state / "identity.json"
    identity = json.loads(identity_path.read_text())
    identity["gateway_url"] = "https://127.0.0.1:9"
    identity_path.write_text(json.dumps(identity))
    started = time.monotonic()
    done = _status(collector, "--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["enrollment"]["error"]["code"] == "gateway_unreachable"
    assert not facts["process"]["alive"] and not facts["process"]["running"]
    assert time.monotonic() - started < 30
    text_out = _status(collector, "--offline").stdout
    assert "enrollment: active when last known" in text_out and "process: not running" in text_out
