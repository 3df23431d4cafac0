"""Day 2: a real collector outlives its certificates, renewing them while tasks flow (docs/day2.md)."""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.renewal import leaf_not_after
from tests.e2e.collector_harness import Collector, Platform
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
