"""Fleet management end to end: `versus-cp` operator commands against `versus-cp up` and a real
`versus-collector` process (WSS control channel, real TLS)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.trust import signed_doc
from common.trust.keys import PublicKey, trusted
from tests.e2e.collector_harness import Collector, Platform, cli_json, wait_for
from tests.e2e.harness import ControlPlane, run_cli

pytestmark = pytest.mark.timeout(240)


def _running(cp: ControlPlane, tmp_path: Path) -> Iterator[tuple[Collector, str]]:
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    collector.start()
    wait_for(lambda: _show(cp, collector_id)["session"].get("state") == "SESSION_STATE_ACTIVE")
    yield collector, collector_id
    collector.stop()


@pytest.fixture
def running(shared_control_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[Collector, str]]:
    """A live collector of its own, on the module's control plane."""
    yield from _running(shared_control_plane, tmp_path)


@pytest.fixture
def running_alone(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> Iterator[tuple[Collector, str]]:
    """A live collector on a control plane of its own (the test lists the whole fleet, then stops it)."""
    yield from _running(start_control_plane(), tmp_path)


def _show(cp: ControlPlane, collector_id: str) -> Any:
    return cli_json(["collectors", "show", collector_id], cp.env)["collector"]


def test_operator_views_and_vault_mode_restart(running: tuple[Collector, str]) -> None:
    collector, cid = running
    cp = collector.cp
    listed = run_cli(["collectors", "list", "--query", cid[:10]], cp.env)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["COLLECTOR", "SITE", "HOSTNAME", "VERSION", "STATUS", "SESSION", "DRIVERS"]
    assert row.split()[0] == cid and "active" in row.split() and "stub" in row

    shown = run_cli(["collectors", "show", cid], cp.env)
    assert shown.returncode == 0, shown.stderr
    for text in (
        "Identity",
        "Live session",
        "transport",
        "wss",
        "A local",
        "Driver capabilities",
        "mutate_terminal",
    ):
        assert text in shown.stdout, text
    probe = run_cli(["collectors", "probe", cid], cp.env)
    assert probe.returncode == 0 and "reachable" in probe.stdout

    before = _show(cp, cid)["session"]
    switched = run_cli(["collectors", "vault-mode", cid, "B"], cp.env)
    assert switched.returncode == 0, switched.stderr
    # The collector is told on its held claim, restarts (same PID: it re-executes itself) and reports B.
    wait_for(lambda: _show(cp, cid)["session"].get("vault_mode") == "VAULT_MODE_CLOUD_RELAYED", timeout=60)
    after = _show(cp, cid)
    assert after["vault_mode"] == "VAULT_MODE_CLOUD_RELAYED"
    assert after["session"]["session_id"] != before["session_id"]
    assert collector.log().count("collector started") == 2
    assert collector.proc is not None and collector.proc.poll() is None
    # It runs on the signed config it was sent, kept as it arrived (docs/day2.md).
    keys = json.loads((collector.state / "keys.json").read_text())["dispatch"]
    config = signed_doc.verify(
        json.loads((collector.state / "config.json").read_text()),
        trusted(PublicKey.from_json(k) for k in keys),
        kind="collector_config",
        collector_id=cid,
        now=int(time.time()),
    )
    assert (config["version"], config["vault_mode"]) == (1, "relayed")
    assert "config accepted" in collector.log()

    # Work still flows after the restart, and the queue shows it.
    platform = Platform(cp)
    try:
        task_id = platform.submit(collector.site_id, "echo", "read", "dev-q", {"q": 1}, "after-restart")
        platform.wait_state(task_id, {"success"})
    finally:
        platform.close()
    queue = cli_json(["queue", "list", "--outcome", "success", "--collector", cid], cp.env)["dispatches"]
    assert [d["task_id"] for d in queue] == [task_id]
    detail = run_cli(["queue", "show", queue[0]["dispatch_id"]], cp.env)
    assert detail.returncode == 0 and "History" in detail.stdout and "success" in detail.stdout

    audit = run_cli(["audit", "list", "--subject", cid], cp.env)
    assert audit.returncode == 0
    assert "collector.vault_mode" in audit.stdout and "bootstrap-admin" in audit.stdout


def test_roles_and_revoke_from_the_command_line(running: tuple[Collector, str]) -> None:
    collector, cid = running
    cp = collector.cp
    viewer = {**cp.env, "VERSUS_API_TOKEN": cp.mint_token("viewer")}
    assert run_cli(["collectors", "list"], viewer).returncode == 0
    refused = run_cli(["collectors", "drain", cid], viewer)
    assert refused.returncode == 3
    assert (
        refused.stderr.strip()
        == "versus-cp: error: role 'viewer' may not call DrainCollector (permission_denied)"
    )
    bogus = run_cli(["collectors", "list"], {**cp.env, "VERSUS_API_TOKEN": "vsk_not-a-token"})
    assert bogus.returncode == 3 and "(api_token_invalid)" in bogus.stderr

    revoked = run_cli(["collectors", "revoke", cid, "--reason", "decommissioned"], cp.env)
    assert revoked.returncode == 0, revoked.stderr
    assert collector.proc is not None
    assert collector.proc.wait(30) == 1  # told on its next request; it stops instead of retrying
    assert "identity was revoked" in collector.log()
    assert _show(cp, cid)["status"] == "COLLECTOR_STATUS_REVOKED"
    again = run_cli(["collectors", "approve", cid], cp.env)
    assert again.returncode == 5 and "(collector_wrong_status)" in again.stderr


def test_a_second_process_with_the_same_identity_replaces_the_first(running: tuple[Collector, str]) -> None:
    first, cid = running
    second = Collector(first.cp, first.state, first.log_path.with_name("second.log"), first.site_id)
    second.start()
    try:
        assert first.proc is not None
        assert first.proc.wait(30) == 1
        assert "another process started with this collector's identity" in first.log()
        wait_for(lambda: second.log().count("claim refused") == 0 and _show(first.cp, cid)["session"]["state"]
                 == "SESSION_STATE_ACTIVE")  # fmt: skip
        assert second.proc is not None and second.proc.poll() is None
    finally:
        second.stop()


def test_operator_commands_find_the_running_up_without_port_variables(
    running_alone: tuple[Collector, str],
) -> None:
    """`up` runs on ports of its own (set through variables); an operator shell that only knows the
    state directory still reaches it, and explicit settings still win."""
    collector, collector_id = running_alone
    cp = collector.cp
    bare = {k: v for k, v in cp.env.items() if not k.startswith(("VERSUS_ROUTER_", "VERSUS_ENROLLMENT_"))}
    listed = cli_json(["collectors", "list"], bare)["collectors"]
    assert [c["collector_id"] for c in listed] == [collector_id]
    assert cli_json(["sites", "list"], bare)["sites"]
    wrong = run_cli(["collectors", "list"], {**bare, "VERSUS_ROUTER_PORT": "1"})
    assert wrong.returncode == 1 and "cannot reach the service" in wrong.stderr
    assert json.loads((cp.state_dir / "endpoints.json").read_text())["router"].endswith(
        f":{cp.port('router')}"
    )
    assert cp.stop() == 0
    assert not (cp.state_dir / "endpoints.json").exists()
