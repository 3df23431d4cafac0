"""`versus-cp tasks`: submit, watch, get and cancel from the command line, against real processes."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.drivers.stub import dump_blocks
from tests.e2e.collector_harness import Collector, wait_for
from tests.e2e.harness import ControlPlane, run_cli

pytestmark = pytest.mark.timeout(180)


def test_tasks_commands(start_control_plane: Callable[..., ControlPlane], tmp_path: Path) -> None:
    cp = start_control_plane()
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    collector.start()
    platform_env = {**cp.env, "VERSUS_API_TOKEN": cp.mint_token("platform", "cli-platform")}
    target = ["--site", collector.site_id, "--tenant", "acme", "--provider", "stub"]
    try:
        done = run_cli(
            ["tasks", "submit", *target, "--operation", "echo", "--class", "read", "--target", "dev-1",
             "--params", '{"hello": "cli"}', "--key", "cli-1", "--wait", "--json"],
            platform_env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        states = [json.loads(line)["state"] for line in done.stdout.splitlines()]
        assert states[-1] == "success"
        task_id = json.loads(done.stdout.splitlines()[0])["task_id"]

        got = run_cli(["tasks", "get", task_id, "--json"], cp.env)  # the admin token may read
        assert got.returncode == 0, got.stderr
        task = json.loads(got.stdout)["task"]
        assert json.loads(base64.b64decode(task["result"])) == {"hello": "cli"}
        human = run_cli(["tasks", "get", task_id], cp.env)
        assert "state" in human.stdout and "success" in human.stdout
        listed = run_cli(["tasks", "list", "--state", "success", "--label", "none=x", "--json"], cp.env)
        assert listed.returncode == 0 and json.loads(listed.stdout).get("tasks", []) == [], listed.stderr
        listed = run_cli(["tasks", "list", "--state", "success", "--target", "dev-1", "--since", "1"], cp.env)
        assert task_id in listed.stdout and "success" in listed.stdout, listed.stderr

        # A dispatch key rotation does not cut off a collector enrolled before it: its envelopes are
        # signed with the key it was given (the router re-reads the key set within 2 s).
        rotated = run_cli(["keys", "rotate", "--set", "dispatch"], cp.env)
        assert rotated.returncode == 0, rotated.stderr
        time.sleep(2.5)
        after = run_cli(
            ["tasks", "submit", *target, "--operation", "echo", "--class", "read", "--target", "dev-1",
             "--key", "cli-rotated", "--wait", "--json"],
            platform_env,
        )  # fmt: skip
        assert after.returncode == 0, after.stderr + collector.log()

        # An operation nobody offers waits in the queue: cancel it.
        queued = run_cli(
            ["tasks", "submit", *target, "--operation", "nonexistent", "--class", "read", "--target", "dev-2",
             "--key", "cli-2", "--json"],
            platform_env,
        )  # fmt: skip
        assert queued.returncode == 0, queued.stderr
        queued_id = json.loads(queued.stdout)["task"]["task_id"]
        cancelled = run_cli(["tasks", "cancel", queued_id, "--reason", "not needed"], cp.env)
        assert cancelled.returncode == 0, cancelled.stderr
        assert f"task {queued_id} is cancelled" in cancelled.stdout
        watched = run_cli(["tasks", "watch", queued_id], cp.env)
        assert watched.returncode == 5  # settled, but not a success
        assert watched.stdout.strip().endswith("cancelled")

        # Running work that needs cancel: the collector is asked to stop it, and the task ends cancelled.
        running = run_cli(
            ["tasks", "submit", *target, "--operation", "echo", "--class", "read", "--target", "dev-3",
             "--params", '{"sleep": 60}', "--key", "cli-3", "--feature", "cancel", "--json"],
            platform_env,
        )  # fmt: skip
        assert running.returncode == 0, running.stderr
        running_task = json.loads(running.stdout)["task"]
        assert running_task["features"] == ["cancel"]
        wait_for(lambda: "dispatched" in run_cli(["tasks", "get", running_task["task_id"]], cp.env).stdout)
        asked = run_cli(["tasks", "cancel", running_task["task_id"], "--reason", "too slow"], cp.env)
        assert asked.returncode == 0, asked.stderr
        assert "its collector was asked to stop it" in asked.stdout
        watched = run_cli(["tasks", "watch", running_task["task_id"]], cp.env)
        assert watched.returncode == 5 and watched.stdout.strip().endswith("cancelled")
        shown = run_cli(["tasks", "get", running_task["task_id"]], cp.env).stdout
        assert "cancel requested: too slow" in shown and "cancel" in shown

        # Streamed output (3 MiB: several chunks) written to a file, checked against its SHA-256.
        dumped = run_cli(
            ["tasks", "submit", *target, "--operation", "dump", "--class", "read", "--target", "dev-4",
             "--params", '{"bytes": 3145728, "seed": "cli"}', "--feature", "output_stream", "--key", "cli-4",
             "--wait", "--json"],
            platform_env,
        )  # fmt: skip
        assert dumped.returncode == 0, dumped.stderr + collector.log()
        dump_id = json.loads(dumped.stdout.splitlines()[0])["task_id"]
        saved = tmp_path / "dump.bin"
        read = run_cli(["tasks", "output", dump_id, "--out", str(saved)], cp.env)
        assert read.returncode == 0, read.stderr
        assert "3145728 bytes written" in read.stderr and "(complete)" in read.stderr
        assert saved.read_bytes() == b"".join(dump_blocks("cli", 3145728))

        # Only platform tokens submit: the admin token is refused (exit 3), bad params before sending (2).
        echo = ["tasks", "submit", *target, "--operation", "echo", "--class", "read", "--target", "d"]
        denied = run_cli(echo, cp.env)
        assert denied.returncode == 3, denied.stderr
        bad = run_cli([*echo, "--params", "{not json"], platform_env)
        assert bad.returncode == 2 and "params_invalid" in bad.stderr
    finally:
        collector.stop()
