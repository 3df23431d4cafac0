"""Credential revocation with real processes: a current collector's running task holds its device
credential (credentials.json, vault mode A) and the operator takes it back with `versus-cp
credentials revoke` — acked as scrubbed, then killed; and for a collector that was stopped, shown
unreachable until it returns and answers (docs/protocol.md, "Credential revocation")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from versus.router.v1 import task_pb2

from tests.e2e.collector_harness import Collector, Platform, wait_for
from tests.e2e.harness import ControlPlane, run_cli

pytestmark = pytest.mark.timeout(240)

DEVICE = "dev-cred"


@pytest.fixture
def fleet(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[ControlPlane, Collector, Platform]]:
    cp = shared_control_plane
    c = Collector(cp, tmp_path / "c", tmp_path / "c.log", devices=tmp_path / "devices")
    c.enroll()
    creds = c.state / "credentials.json"
    creds.write_text(json.dumps({"stub": {DEVICE: {"token": "s3cret-token"}}}))
    os.chmod(creds, 0o600)
    c.start()
    platform = Platform(cp)
    yield cp, c, platform
    c.stop()
    platform.close()


def _running_with_credential(c: Collector, platform: Platform, key: str) -> str:
    params = {"sleep": 90, "credential": True}
    task_id = platform.submit(c.site_id, "echo", "read", DEVICE, params, key, features=["credential_revoke"])
    platform.wait_state(task_id, {"dispatched"}, timeout=60)
    time.sleep(1.0)  # the driver holds the credential and waits
    return task_id


def _revoke(cp: ControlPlane, *extra: str) -> Any:
    done = run_cli(["credentials", "revoke", f"stub:{DEVICE}", *extra, "--json"], cp.env)
    assert done.returncode in (0, 5), done.stderr
    return json.loads(done.stdout)["revocation"]


def _show(cp: ControlPlane, revocation_id: str) -> Any:
    return cp.api.revocation(revocation_id)["revocation"]


def test_a_revoke_is_acked_scrubbed_and_a_kill_stops_the_task(
    fleet: tuple[ControlPlane, Collector, Platform],
) -> None:
    cp, c, platform = fleet
    task_id = _running_with_credential(c, platform, "cred-1")
    dispatch_id = platform.task(task_id).task.history[-1].dispatch_id
    scrubbed = _revoke(cp, "--reason", "token leaked", "--wait", "20")
    assert scrubbed["state"] == "REVOCATION_STATE_REVOKED", scrubbed
    assert scrubbed["targets"][0]["results"] == {dispatch_id: "scrubbed"}
    # Scrubbed, not stopped: the task runs on without the credential.
    assert platform.task(task_id).task.state == task_pb2.TASK_STATE_DISPATCHED
    killed = _revoke(cp, "--kill", "--wait", "20")
    assert killed["state"] == "REVOCATION_STATE_REVOKED"
    assert killed["targets"][0]["results"] == {dispatch_id: "killed"}
    ended = platform.wait_state(task_id, {"cancelled", "failed"}, timeout=20)
    # Stopped because its credential was taken back: failed with that code (a read changed nothing).
    assert (ended.state, ended.error_code) == (task_pb2.TASK_STATE_FAILED, "credential_revoked")
    assert "credential revoked from running tasks" in c.log() and "s3cret-token" not in c.log()
    human = run_cli(["credentials", "revocations", "--ref", f"stub:{DEVICE}"], cp.env)
    assert human.returncode == 0 and scrubbed["revocation_id"] in human.stdout
    # Vault mode B's store from the command line: the value goes in by stdin and never comes out.
    put = subprocess.run(
        [sys.executable, "-m", "versus_cp", "credentials", "put", "ssh:sw-9", "--tenant", "acme"],
        input='{"username": "ops", "password": "pw-secret-9"}', env=cp.env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert put.returncode == 0 and "version 1" in put.stdout, put.stderr
    listed = run_cli(["credentials", "list", "--tenant", "acme"], cp.env)
    assert "ssh:sw-9" in listed.stdout and "password, username" in listed.stdout
    assert "pw-secret-9" not in listed.stdout + cp.log()


def test_a_stopped_collector_is_unreachable_until_it_returns_and_acks(
    fleet: tuple[ControlPlane, Collector, Platform],
) -> None:
    cp, c, platform = fleet
    _running_with_credential(c, platform, "cred-2")
    c.signal(signal.SIGSTOP)
    try:
        asked = _revoke(cp)
        assert asked["state"] in ("REVOCATION_STATE_PENDING", "REVOCATION_STATE_UNREACHABLE")
        rid = asked["revocation_id"]
        # No answer within the ack window: the material is still out there, and the view says so.
        wait_for(lambda: _show(cp, rid)["state"] == "REVOCATION_STATE_UNREACHABLE", timeout=60)
    finally:
        c.signal(signal.SIGCONT)
    wait_for(lambda: _show(cp, rid)["state"] == "REVOCATION_STATE_REVOKED", timeout=60)
    assert list(_show(cp, rid)["targets"][0]["results"].values()) == ["scrubbed"]
