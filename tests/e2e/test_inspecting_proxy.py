"""A TLS-inspecting proxy the collector trusts (mitmproxy) can read everything and change nothing.

The collector trusts the proxy's CA, as corporate collectors trust their
inspection appliance, and reaches the gateway only through it. Everything works
through it; then the proxy replays a claim and a report, changes a report's
outcome, swaps a claim's body under its token and rewrites a signed config:
each is refused with a stable code, and PostgreSQL shows only what the
collector really did (docs/threat-model.md).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.collector_harness import Collector, Platform, cli_json, wait_for
from tests.e2e.harness import ControlPlane, run_cli
from tests.support.devices import EchoDevice
from tests.support.mitm import InterceptingProxy

pytestmark = pytest.mark.timeout(300)


def test_an_inspecting_proxy_can_neither_replay_nor_alter_anything(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane  # the proxy sits between one collector and the gateway, nothing else
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    with InterceptingProxy(tmp_path / "mitm", cp.port("gateway"), cp.ca_file) as mitm:
        (collector.state / "extra-ca.pem").write_bytes(mitm.ca_pem)
        collector.use_gateway(mitm.url)
        collector.start()
        platform = Platform(cp)
        n = 0

        def task() -> Any:
            nonlocal n
            n += 1
            task_id = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": n}, f"mitm-{n}")
            return platform.wait_state(task_id, {"success", "failed", "expired", "indeterminate"}, 60)

        def attacked(kind: str) -> dict[str, Any]:
            wait_for(lambda: any(r["kind"] == kind for r in mitm.results()), timeout=30)
            return next(r for r in mitm.results() if r["kind"] == kind)

        try:
            assert task().error_code == ""  # everything works through the proxy

            mitm.arm("replay_claim")
            assert task().error_code == ""
            replayed = attacked("replayed")
            assert (replayed["path"], replayed["status"], replayed["code"]) == (
                "/api/collector/v1/claim", 401, "bearer_replayed")  # fmt: skip

            mitm.arm("replay_report")
            assert task().error_code == ""
            wait_for(lambda: len([r for r in mitm.results() if r["kind"] == "replayed"]) == 2, timeout=30)
            again = [r for r in mitm.results() if r["kind"] == "replayed"][-1]
            assert (again["path"], again["status"], again["code"]) == (
                "/api/collector/v1/report", 401, "bearer_replayed")  # fmt: skip

            # The proxy turns a success into a failure: refused; the collector re-sends the real one.
            mitm.arm("change_report_outcome")
            changed = task()
            altered = attacked("change_report_outcome")
            assert (altered["status"], altered["code"]) == (401, "bearer_wrong_body")
            assert changed.error_code == "" and "report refused in transit" in collector.log()

            mitm.arm("swap_claim_body")
            assert task().error_code == ""
            swapped = attacked("swap_claim_body")
            assert (swapped["status"], swapped["code"]) == (401, "bearer_wrong_body")

            # An operator switches the vault mode; the proxy rewrites the signed config on its way to
            # point the collector at its own Vault. The collector refuses it and keeps its config;
            # the genuine document, on the next claim, is applied.
            mitm.arm("change_config")
            switched = run_cli(["collectors", "vault-mode", collector_id, "B"], cp.env)
            assert switched.returncode == 0, switched.stderr
            assert attacked("change_config")["delivered"]
            wait_for(lambda: "config refused; keeping the last good one" in collector.log(), timeout=30)
            wait_for(lambda: collector.log().count("collector started") == 2, timeout=60)
            config = json.loads((collector.state / "config.json").read_text())
            assert "evil" not in json.dumps(config) and "bad_signature" in collector.log()
            assert task().error_code == ""
        finally:
            platform.close()
            collector.stop()

    # PostgreSQL shows exactly what the collector did: every task succeeded once, one dispatch each,
    # the vault mode is the operator's, and no report was ever refused for its signature.
    dispatches = cli_json(["queue", "list", "--collector", collector_id], cp.env)["dispatches"]
    assert len(dispatches) == n == len({d["task_id"] for d in dispatches}), dispatches
    assert {(d["state"], d["task_state"], d["error_code"]) for d in dispatches} == {
        ("TASK_STATE_SUCCESS", "TASK_STATE_SUCCESS", "")
    }, dispatches
    shown = cp.api.collector(collector_id)
    assert shown["vault_mode"] == "VAULT_MODE_CLOUD_RELAYED"
    audit = cli_json(["audit", "list", "--action", "report.bad_signature", "--subject", collector_id], cp.env)
    assert audit.get("events", []) == []


class _EvilDevice:
    """Where a proxy would like tunnels to go: answers "EVIL" and counts who came."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                self.accepted += 1
                with conn:
                    conn.sendall(b"EVIL\n")

    def close(self) -> None:
        self.server.close()


def test_an_inspecting_proxy_cannot_redirect_a_tunnel(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    echo, evil = EchoDevice(), _EvilDevice()
    with InterceptingProxy(tmp_path / "mitm", cp.port("gateway"), cp.ca_file) as mitm:
        (mitm.root / "evil_port").write_text(str(evil.port))
        (collector.state / "extra-ca.pem").write_bytes(mitm.ca_pem)
        collector.use_gateway(mitm.url)
        collector.start()
        try:
            wait_for(lambda: "capabilities published" in collector.log())

            def tunnel() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [sys.executable, "-m", "versus_cp", "tunnel", "--target", f"127.0.0.1:{echo.port}",
                     "--site", collector.site_id, "--tenant", "acme"],
                    env=cp.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )  # fmt: skip

            # The readable copy of the offer now names the proxy's device: the collector dials the
            # signed one, so the bytes still reach the echo device.
            mitm.arm("rewrite_offer")
            proc = tunnel()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(b"ping\n")
            proc.stdin.flush()
            assert proc.stdout.read(5) == b"ping\n"
            assert next(r for r in mitm.results() if r["kind"] == "rewrite_offer")["delivered"]
            proc.kill()
            proc.communicate(timeout=10)

            # The signed payload itself rewritten: the collector refuses the offer and dials nothing.
            mitm.arm("forge_offer")
            proc = tunnel()
            wait_for(lambda: "tunnel offer refused" in collector.log(), timeout=30)
            assert "bad_signature" in collector.log()
            proc.kill()
            proc.communicate(timeout=10)
            assert evil.accepted == 0
        finally:
            collector.stop()
            echo.close()
            evil.close()
