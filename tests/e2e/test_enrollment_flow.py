"""Enrollment end to end: `up`, the operator CLI, `versus-collector enroll` over real TLS with a CA pin."""

from __future__ import annotations

import json
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ControlPlane, run_cli

pytestmark = pytest.mark.timeout(180)


def _collector(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _cli_json(args: list[str], env: dict[str, str]) -> Any:
    done = run_cli([*args, "--json"], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _enroll_args(command: str, state: Path) -> list[str]:
    argv = shlex.split(command)
    assert argv[:2] == ["versus-collector", "enroll"]
    return [*argv[1:], "--state-dir", str(state)]


def test_operator_issues_a_token_and_a_collector_enrolls(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    env = cp.env
    site = _cli_json(["sites", "create", "lab-mgmt", "--tenant", "acme"], env)["site"]
    site_id = site["site_id"]
    issued = _cli_json(["tokens", "issue", "--site", site_id], env)
    plaintext = str(issued["plaintext"])
    command = str(issued["enroll_command"])
    assert plaintext.startswith("vst_")
    assert "--ca-pin sha256/" in command and f"--url https://localhost:{cp.port('gateway')}" in command

    assert plaintext not in command  # the token never goes on a command line
    state = tmp_path / "collector"
    done = _collector(_enroll_args(command, state), env, plaintext + "\n")
    assert done.returncode == 0, done.stderr
    assert "enrolled as col-" in done.stdout and ": active" in done.stdout
    identity = json.loads((state / "identity.json").read_text())
    assert (identity["site_id"], identity["status"]) == (site_id, "active")
    assert stat.S_IMODE((state / "key.pem").stat().st_mode) == 0o600
    published = _cli_json(["keys", "list"], env)
    pinned = json.loads((state / "keys.json").read_text())
    assert pinned["dispatch"] == published["dispatch"]
    assert pinned["release"] == published["release"]

    status = _collector(["status", "--state-dir", str(state)], env)
    assert status.returncode == 0, status.stderr
    assert f"{identity['collector_id']} in site {site_id}" in status.stdout
    assert "enrollment: active (the control plane says)" in status.stdout

    tokens = _cli_json(["tokens", "list", "--site", site_id], env)["tokens"]
    assert [(t["uses"], t["max_uses"], t["status"]) for t in tokens] == [(1, 1, "TOKEN_STATUS_EXHAUSTED")]
    # The spent token cannot enroll anyone else.
    again = _collector([*_enroll_args(command, tmp_path / "other")], env, plaintext + "\n")
    assert again.returncode == 1
    assert "invalid_token" in again.stderr
    # The token plaintext never reached the control plane's logs.
    assert plaintext.removeprefix("vst_") not in cp.log()


def test_manual_approval_and_a_wrong_pin(shared_control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = shared_control_plane
    env = cp.env
    site_id = _cli_json(["sites", "create", "dmz", "--tenant", "acme"], env)["site"]["site_id"]
    issued = _cli_json(["tokens", "issue", "--site", site_id, "--manual-approval", "--max-uses", "2"], env)
    command, token = str(issued["enroll_command"]), str(issued["plaintext"]) + "\n"

    wrong = re.sub(r"--ca-pin \S+", "--ca-pin sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", command)
    refused = _collector(_enroll_args(wrong, tmp_path / "wrong"), env, token)
    assert refused.returncode == 1
    assert "ca_pin_mismatch" in refused.stderr

    state = tmp_path / "pending"
    done = _collector(_enroll_args(command, state), env, token)
    assert done.returncode == 0, done.stderr
    assert ": pending" in done.stdout
    collector_id = json.loads((state / "identity.json").read_text())["collector_id"]
    assert "pending" in _collector(["status", "--state-dir", str(state)], env).stdout

    approved = run_cli(["collectors", "approve", collector_id, "--json"], env)
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["collector"]["status"] == "COLLECTOR_STATUS_ACTIVE"
    assert "active" in _collector(["status", "--state-dir", str(state)], env).stdout
    assert json.loads((state / "identity.json").read_text())["status"] == "active"

    missing = run_cli(["collectors", "approve", "col-does-not-exist"], env)
    assert missing.returncode == 4  # not found
    assert missing.stderr.strip() == (
        "versus-cp: error: collector 'col-does-not-exist' does not exist (collector_not_found)"
    )


def test_cli_reports_refusals_in_one_line(shared_control_plane: ControlPlane) -> None:
    cp = shared_control_plane
    site_id = _cli_json(["sites", "create", "core", "--tenant", "acme"], cp.env)["site"]["site_id"]
    too_long = run_cli(["tokens", "issue", "--site", site_id, "--ttl", str(2 * 86400)], cp.env)
    assert too_long.returncode == 2  # bad argument
    assert too_long.stderr.startswith("versus-cp: error: ttl must be at most 86400 seconds")
    assert too_long.stderr.strip().endswith("(ttl_too_long)")
    duplicate = run_cli(["sites", "create", "core", "--tenant", "acme"], cp.env)
    assert duplicate.returncode == 5  # refused in the current state
    assert "already has a site named 'core'" in duplicate.stderr
    no_site = run_cli(["tokens", "issue", "--site", "site-nope"], cp.env)
    assert no_site.returncode == 4
    assert no_site.stderr.strip() == "versus-cp: error: site 'site-nope' does not exist (site_not_found)"
