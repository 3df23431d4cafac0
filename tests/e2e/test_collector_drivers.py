"""The ssh and http drivers through the whole system, against real servers on loopback."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.config.state_dir import write_private
from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane, run_cli
from tests.support.devices import HttpsDevice, SshDevice

pytestmark = pytest.mark.timeout(180)


def test_ssh_and_http_drivers(shared_control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    ssh_device = SshDevice()
    https_device = HttpsDevice(tmp_path / "https-device")
    platform = Platform(cp)
    try:
        secret = "device-api-token-123"
        credentials = {
            "ssh": {"sw-7": ssh_device.credentials()},
            "http": {"lb-1": https_device.credentials(secret)},
        }
        write_private(collector.state / "credentials.json", json.dumps(credentials).encode())
        collector.start()

        # A device command can carry a secret: it must never reach the collector's log.
        command = "uname # sekrit-cmd-4242"
        ssh_task = platform.submit(
            collector.site_id, "show", "read", "sw-7", {"command": command}, "ssh-1", provider="ssh"
        )
        result = json.loads(platform.wait_state(ssh_task, {"success"}).result)
        assert result["exit_status"] == 0
        assert result["stdout"].strip() == "Linux"
        assert ssh_device.commands == [command]

        http_task = platform.submit(
            collector.site_id,
            "request",
            "mutate_terminal",
            "lb-1",
            {"method": "POST", "path": "/pool/web/disable"},
            "http-1",
            provider="http",
        )
        reply = json.loads(platform.wait_state(http_task, {"success"}).result)
        assert reply["status"] == 200
        assert json.loads(base64.b64decode(reply["body_b64"])) == {
            "device": "lb-1",
            "method": "POST",
            "path": "/pool/web/disable",
        }
        # The credential was injected on the collector; it never travelled with the task.
        assert https_device.requests == [("POST", "/pool/web/disable", f"Bearer {secret}")]
        assert secret not in collector.log() and ssh_device.password not in collector.log()
        assert "sekrit-cmd-4242" not in collector.log()
        # asyncssh narrates connections and logins (with the user) at INFO: not in the log either.
        assert "Opening SSH connection" not in collector.log() and "Auth for user" not in collector.log()
        assert secret not in cp.log()

        # Vault mode A: the plaintext file was sealed and removed at start, and nothing in the state
        # directory holds a credential in plaintext.
        assert not (collector.state / "credentials.json").exists()
        for path in (p for p in collector.state.rglob("*") if p.is_file()):
            data = path.read_bytes()
            assert secret.encode() not in data and ssh_device.password.encode() not in data, path
        # The operator replaces a credential with the command line; the next task uses it.
        rotated = "device-api-token-456"
        done = subprocess.run(
            [*collector.command, "credentials", "set", "http", "lb-1", "--state-dir", str(collector.state)],
            input=json.dumps(https_device.credentials(rotated)), env=collector._env(), capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        again = platform.submit(
            collector.site_id, "request", "mutate_terminal", "lb-1", {"method": "POST", "path": "/again"},
            "http-2", provider="http",
        )  # fmt: skip
        platform.wait_state(again, {"success"})
        assert https_device.requests[-1] == ("POST", "/again", f"Bearer {rotated}")
        assert rotated not in collector.log()
    finally:
        collector.stop()
        platform.close()
        ssh_device.close()
        https_device.close()


def test_ssh_logs_in_with_a_credential_relayed_in_vault_mode_b(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    ssh_device = SshDevice()
    platform = Platform(cp)
    try:
        # The credential lives in the control plane (encrypted at rest), written by stdin only.
        put = subprocess.run(
            [sys.executable, "-m", "versus_cp", "credentials", "put", "ssh:sw-7", "--tenant", "acme"],
            input=json.dumps(ssh_device.credentials()), env=cp.env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert put.returncode == 0, put.stderr
        switched = run_cli(["collectors", "vault-mode", collector_id, "B"], cp.env)
        assert switched.returncode == 0, switched.stderr
        collector.start()
        task = platform.submit(
            collector.site_id, "show", "read", "sw-7", {"command": "uname"}, "ssh-b", provider="ssh"
        )
        result = json.loads(platform.wait_state(task, {"success"}, timeout=90).result)
        assert result["stdout"].strip() == "Linux"
        # Relayed for that task only: never on the collector's disk, in its log or the control plane's.
        assert not (collector.state / "credentials.sealed").exists()
        for path in (p for p in collector.state.rglob("*") if p.is_file()):
            assert ssh_device.password.encode() not in path.read_bytes(), path
        assert ssh_device.password not in collector.log() + cp.log()
    finally:
        collector.stop()
        platform.close()
        ssh_device.close()
