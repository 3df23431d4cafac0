"""Signed self-upgrade under the manual policy, with real processes (issue 20 acceptance):

a collector running version A (this tree) under its supervisor is offered B; an approval that is
cancelled before the collector picks it up installs nothing; an approval installs B through TUF
while tasks keep flowing, and the fleet view shows B; a release B' that cannot reach the control
plane is rolled back to B automatically, reported, and audited.
"""

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
from tests.e2e.upgrade_harness import (
    ReplicaGateway,
    Supervised,
    build_release,
    metadata_url,
    publish,
    update_view,
)
from tests.support.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.timeout(600)

VERSION_B, VERSION_BAD = "0.2.0", "0.3.0"


def _task_succeeds(platform: Platform, collector: Collector, key: str) -> None:
    task_id = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": key}, key)
    task = platform.wait_state(task_id, {"success", "failed", "expired"}, timeout=60)
    assert task.state == task_pb2.TASK_STATE_SUCCESS, task


def test_manual_approve_cancel_install_and_roll_back(
    start_control_plane: Callable[..., ControlPlane], release_cache: Path, tmp_path: Path
) -> None:
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(build_release, release_cache, VERSION_B)
        bad = pool.submit(build_release, release_cache, VERSION_BAD, broken=True)
        cp = start_control_plane()
        collector = Collector(cp, tmp_path / "state", tmp_path / "collector.log")
        cid = collector.enroll()  # a new site: the manual policy is the default
        artifact_b, artifact_bad = good.result(), bad.result()
    supervised = Supervised(collector)
    supervised.start()
    platform = Platform(cp)
    ca = Path(cp.env["VERSUS_STATE_DIR"]) / "tls" / "gateway-ca.pem"
    replica: ReplicaGateway | None = None
    link: CuttableProxy | None = None
    try:
        wait_for(lambda: update_view(cp, cid).get("running_version") == VERSION_A, timeout=60)
        publish(cp, artifact_b, VERSION_B)
        card = update_view(cp, cid)
        assert card["latest_version"] == VERSION_B and card["badge"] == "UPDATE_BADGE_UPDATE_AVAILABLE", card
        outdated = cli_json(["collectors", "list", "--outdated"], cp.env)
        assert [c["collector_id"] for c in outdated["collectors"]] == [cid]
        assert outdated["outdated_count"] == 1

        # Cancelled before the collector picked it up: nothing is installed.
        assert supervised.stop() == 0
        applied = cli_json(["collectors", "update", "apply", cid, "--version", VERSION_B], cp.env)
        assert applied["collector"]["update"]["badge"] == "UPDATE_BADGE_UPDATING"
        cancelled = cli_json(["collectors", "update", "cancel", cid], cp.env)
        assert not cancelled["collector"]["update"].get("target_version")
        # From here the supervisor reaches the update repository through a second gateway, over a
        # slow link, so that gateway can be killed in the middle of the artifact (issue 45).
        replica = ReplicaGateway(cp, tmp_path / "replica-gateway.log")
        replica.start(ca)
        size = artifact_b.stat().st_size
        link = CuttableProxy(replica.port, rate=max(256_000.0, size / 8))
        supervised.manifest_url = metadata_url(f"https://127.0.0.1:{link.port}")
        supervised.extra = ("--download-retry", "2")
        supervised.start()
        wait_for(lambda: collector.runtime().get("last_claim_at", 0) > time.time() - 3, timeout=60)
        time.sleep(5)  # several supervisor checks
        assert supervised.status() == {} and collector.runtime()["agent_version"] == VERSION_A
        _task_succeeds(platform, collector, "before")

        # Approved: the gateway serving the download is SIGKILLed mid-artifact. The supervisor reports
        # update_download_failed and keeps the collector working; the card says the update failed.
        cli_json(["collectors", "update", "apply", cid], cp.env)  # the latest: B
        wait_for(lambda: link.relayed > size // 4, timeout=120)
        replica.kill()
        wait_for(
            lambda: supervised.status().get("detail", "").startswith("update_download_failed"), timeout=60
        )
        assert supervised.status()["state"] == "failed" and supervised.proc is not None
        assert supervised.proc.poll() is None, "the supervisor died with the download"
        _task_succeeds(platform, collector, "download-broken")
        wait_for(lambda: update_view(cp, cid).get("badge") == "UPDATE_BADGE_FAILED", timeout=30)
        assert "update_download_failed" in update_view(cp, cid)["detail"]

        # The gateway is back: a later attempt installs B through TUF; it is started and kept.
        replica.start(ca)
        wait_for(lambda: supervised.status().get("state") == "updated", timeout=180)
        assert collector.runtime()["agent_version"] == VERSION_B
        wait_for(lambda: update_view(cp, cid).get("badge") == "UPDATE_BADGE_UP_TO_DATE", timeout=30)
        assert update_view(cp, cid)["running_version"] == VERSION_B
        assert (supervised.install_dir / "current").resolve().name == VERSION_B
        _task_succeeds(platform, collector, "after-b")

        # B' starts but never reaches the control plane: rolled back to B, reported and audited.
        publish(cp, artifact_bad, VERSION_BAD)
        cli_json(["collectors", "update", "apply", cid, "--version", VERSION_BAD], cp.env)
        wait_for(lambda: update_view(cp, cid).get("badge") == "UPDATE_BADGE_ROLLED_BACK", timeout=240)
        card = update_view(cp, cid)
        assert card["running_version"] == VERSION_B and card["state_version"] == VERSION_BAD, card
        assert "did not reach the control plane" in card["detail"], card
        assert not card.get("target_version") and not card.get("approved_version"), card
        assert (supervised.install_dir / "current").resolve().name == VERSION_B
        audit = cli_json(["audit", "list", "--subject", cid, "--action", "collector.update"], cp.env)
        actions = [e["action"] for e in audit["events"]]
        assert "collector.update_rolled_back" in actions and "collector.update_updated" in actions, actions
        _task_succeeds(platform, collector, "after-rollback")
        # A config that only moved the target was taken in stride, not treated as refused.
        assert "config refused" not in collector.log()
    finally:
        platform.close()
        supervised.stop()
        if replica is not None:
            replica.kill()
        if link is not None:
            link.close()
