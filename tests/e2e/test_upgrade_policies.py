"""Site update policies with real processes (issue 20 acceptance): under ``auto`` a collector
installs a security release on its own; under ``pinned`` a collector stays on the pinned version
while a newer one is published, and moves when the pin does."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from versus.router.v1 import task_pb2

from collector import __version__ as VERSION_A
from tests.e2e.collector_harness import Collector, Platform, cli_json, wait_for
from tests.e2e.harness import ControlPlane
from tests.e2e.upgrade_harness import Supervised, build_release, publish, update_view

pytestmark = pytest.mark.timeout(600)

VERSION_B = "0.2.0"


def _site(cp: ControlPlane, name: str, *policy: str) -> str:
    created = cli_json(["sites", "create", name, "--tenant", "acme", *policy], cp.env)
    return str(created["site"]["site_id"])


def test_auto_takes_a_security_release_and_pinned_stays_until_the_pin_moves(
    start_control_plane: Callable[..., ControlPlane], release_cache: Path, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(1) as pool:
        release = pool.submit(build_release, release_cache, VERSION_B)
        cp = start_control_plane()  # default soak: a release without the security flag waits an hour
        auto = Collector(cp, tmp_path / "auto", tmp_path / "auto.log")
        auto_id = auto.enroll(_site(cp, "auto-site", "--update-policy", "auto"))
        pinned = Collector(cp, tmp_path / "pinned", tmp_path / "pinned.log")
        pinned_id = pinned.enroll(
            _site(cp, "pinned-site", "--update-policy", "pinned", "--pinned-version", VERSION_A)
        )
        artifact = release.result()
    supervisors = [Supervised(auto), Supervised(pinned)]
    for s in supervisors:
        s.start()
    platform = Platform(cp)
    try:
        wait_for(
            lambda: all(update_view(cp, c).get("running_version") == VERSION_A for c in (auto_id, pinned_id)),
            timeout=60,
        )
        publish(cp, artifact, VERSION_B, "--security")

        # Auto: installed without anyone approving it; work goes on.
        wait_for(lambda: supervisors[0].status().get("state") == "updated", timeout=180)
        wait_for(lambda: update_view(cp, auto_id).get("running_version") == VERSION_B, timeout=30)
        task_id = platform.submit(auto.site_id, "echo", "read", "dev-1", {"n": 1}, "auto-after")
        task = platform.wait_state(task_id, {"success", "failed", "expired"})
        assert task.state == task_pb2.TASK_STATE_SUCCESS, task

        # Pinned: still on A, shown as behind, no target.
        time.sleep(3)
        card = update_view(cp, pinned_id)
        assert card["running_version"] == VERSION_A and not card.get("target_version"), card
        assert card["badge"] == "UPDATE_BADGE_UPDATE_AVAILABLE" and supervisors[1].status() == {}, card

        # Moving the pin moves the collector (the router notices the site change within its interval).
        cli_json(["sites", "update", pinned.site_id, "--pinned-version", VERSION_B], cp.env)
        wait_for(lambda: supervisors[1].status().get("state") == "updated", timeout=180)
        wait_for(lambda: update_view(cp, pinned_id).get("badge") == "UPDATE_BADGE_UP_TO_DATE", timeout=30)
        fleet = cli_json(["collectors", "list"], cp.env)
        assert {c["collector_id"]: c["agent_version"] for c in fleet["collectors"]} == {
            auto_id: VERSION_B, pinned_id: VERSION_B,
        }  # fmt: skip
        assert fleet["outdated_count"] == 0
    finally:
        platform.close()
        for s in supervisors:
            s.stop()
