"""Secrets rotate in place: device credentials and the gateway service token, no restart (docs/day2.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from versus.router.v1 import task_pb2

from common.config.state_dir import write_private
from tests.e2e.collector_harness import Collector, Platform, cli_json
from tests.e2e.harness import ControlPlane, run_cli
from tests.support.devices import HttpsDevice

pytestmark = pytest.mark.timeout(180)


def test_credentials_and_service_token_rotate_without_a_restart(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    cp = start_control_plane()
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    device = HttpsDevice(tmp_path / "https-device")
    platform = Platform(cp)
    credentials = collector.state / "credentials.json"

    def write_credentials(secret: str | None) -> None:
        http = {"lb-1": device.credentials(secret)} if secret else {}
        write_private(credentials, json.dumps({"http": http}).encode())  # atomic: temporary file, rename

    def get(n: int) -> tuple[str, str]:
        task_id = platform.submit(collector.site_id, "get", "read", "lb-1", {"path": "/status"}, f"rot-{n}",
                                  provider="http")  # fmt: skip
        task = platform.wait_state(task_id, {"success", "failed"})
        return task_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower(), task.error_code

    try:
        write_credentials("first-secret")
        collector.start()
        assert collector.proc is not None
        pid = collector.proc.pid
        assert get(1) == ("success", "")
        write_credentials("second-secret")
        assert get(2) == ("success", "")
        # A credential removed from the file is unusable from the next task on.
        write_credentials(None)
        assert get(3) == ("failed", "no_credentials")
        write_credentials("third-secret")
        assert get(4) == ("success", "")
        assert [auth for _, _, auth in device.requests] == [
            "Bearer first-secret",
            "Bearer second-secret",
            "Bearer third-secret",
        ]

        # The gateway's service token: a new one written into the file, the old one revoked.
        tokens = cli_json(["access", "list", "--json"], cp.env)["tokens"]
        old = [t for t in tokens if t["role"] == "ROLE_SERVICE"]
        new_token = cp.mint_token("service", "rotated-service")
        write_private(cp.state_dir / "service-token", (new_token + "\n").encode())
        for token in old:
            revoked = run_cli(["access", "revoke", token["token_id"]], cp.env)
            assert revoked.returncode == 0, revoked.stderr
        # Revocation reaches every service within 5 s; the next tasks must still flow through the gateway.
        for n in range(5, 8):
            assert get(n) == ("success", "")
        assert collector.proc.pid == pid and collector.proc.poll() is None
        assert "first-secret" not in collector.log() and "third-secret" not in collector.log()
        assert new_token not in cp.log()
    finally:
        collector.stop()
        platform.close()
        device.close()
