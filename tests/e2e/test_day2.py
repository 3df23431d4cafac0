"""Day 2: a real collector outlives its certificates, renewing them while tasks flow (docs/day2.md)."""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.renewal import leaf_not_after
from tests.e2e.collector_harness import Collector, Platform, Tasks
from tests.e2e.harness import ControlPlane, run_cli

pytestmark = pytest.mark.timeout(180)

# Certificates this short are renewed every ~8 s (two thirds of their life, give or take 5 %).
LIFETIME_S = 12


def test_a_collector_renews_through_several_certificate_lifetimes_without_a_failed_task(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    cp = start_control_plane(VERSUS_COLLECTOR_CERT_LIFETIME_S=str(LIFETIME_S))
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    collector.start()
    platform = Platform(cp)
    cert = tmp_path / "collector" / "cert.pem"
    expiries = {leaf_not_after(cert.read_bytes())}
    outcomes: list[str] = []
    try:
        # Past three lifetimes: without renewal the collector would be refused after the first.
        deadline = time.monotonic() + 3 * LIFETIME_S + 4
        n = 0
        while time.monotonic() < deadline:
            n += 1
            task_id = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": n}, f"day2-{n}")
            task = platform.wait_state(task_id, {"success", "failed", "expired", "indeterminate"}, timeout=30)
            outcomes.append(task.error_code or "success")
            expiries.add(leaf_not_after(cert.read_bytes()))
            time.sleep(0.5)
        assert outcomes and set(outcomes) == {"success"}, outcomes
        assert len(expiries) >= 4, f"{len(expiries) - 1} renewals: {collector.log()}"
        assert collector.log().count("certificate renewed") >= 3
        # Operators see the certificate the control plane holds now, not the first one. The collector
        # keeps renewing while we look: the control plane may be one renewal ahead of our last sample,
        # never behind it.
        shown = run_cli(["collectors", "show", collector_id, "--json"], cp.env)
        assert shown.returncode == 0, shown.stderr
        stored = json.loads(shown.stdout)["collector"]["cert_not_after"]
        stored_at = calendar.timegm(time.strptime(stored, "%Y-%m-%dT%H:%M:%SZ"))
        assert max(expiries) <= stored_at <= max(expiries) + LIFETIME_S, (stored, sorted(expiries))
    finally:
        platform.close()
        collector.stop()


def _versions(collector: Collector) -> dict[str, int]:
    versions: dict[str, int] = json.loads((collector.state / "keys.json").read_text()).get("versions", {})
    return versions


def test_key_sets_rotate_in_band_and_a_collector_that_was_away_catches_up(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    cp = start_control_plane()
    online = Collector(cp, tmp_path / "online", tmp_path / "online.log")
    away = Collector(cp, tmp_path / "away", tmp_path / "away.log")
    online_id = online.enroll()
    away.enroll()
    online.start()
    away.start()
    task = Tasks(cp, "rot")

    def keys(*args: str) -> str:
        done = run_cli(["keys", *args], cp.env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def flow_until(done: Callable[[], bool], timeout: float = 60) -> None:
        # Tasks keep flowing (and the online collector keeps claiming) while rotations land.
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, online.log()
            assert task(online) == ""

    try:
        assert task(online) == "" and task(away) == ""
        assert _versions(online) == {"dispatch": 1, "release": 1}
        away.stop()
        original = json.loads(keys("list", "--set", "dispatch", "--json"))["dispatch"][0]["kid"]
        assert "version 2" in keys("rotate", "--set", "dispatch", "--grace", "0s")
        assert "version 2" in keys("rotate", "--set", "release", "--grace", "0s")
        # The update repository's root follows the release set (router/releases/update_repo.py).
        root = json.loads((cp.state_dir / "updates" / "metadata" / "2.root.json").read_text())["signed"]
        assert len(root["roles"]["root"]["keyids"]) == 2
        flow_until(lambda: _versions(online) == {"dispatch": 2, "release": 2})
        # A third dispatch version, then the original key retired: whoever still holds only it
        # (the collector that is away) gets no work until it has walked the chain.
        keys("rotate", "--set", "dispatch", "--grace", "0s")
        assert "version 4" in keys("retire", "--set", "dispatch", original)
        flow_until(lambda: _versions(online)["dispatch"] == 4)
        status = json.loads(keys("status", "--json"))
        assert status["dispatch"]["version"] == 4 and online_id in status["dispatch"]["held_by"]["4"]
        assert original not in {
            k["kid"] for k in json.loads((online.state / "keys.json").read_text())["dispatch"]
        }

        away.start()
        assert task(away) == ""  # it walked 1 -> 4 and 1 -> 2 and works again, with no re-enrollment
        assert _versions(away) == {"dispatch": 4, "release": 2}
        assert away.log().count("key set rotated") == 2
        assert "key set step refused" not in away.log() + online.log()
    finally:
        task.platform.close()
        online.stop()
        away.stop()
