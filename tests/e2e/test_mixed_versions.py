"""A mixed-version fleet with real processes: a collector built before protocol negotiation beside
the current one, against the current control plane (docs/protocol.md)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from versus.router.v1 import task_pb2

from collector.client import ssl_context
from collector.request_auth import SignRequests
from collector.state import StatePaths, load_key
from common import protocol
from router.dispatch.placement import _rendezvous
from tests.e2e.collector_harness import Collector, Platform, wait_for
from tests.e2e.harness import ControlPlane
from tests.support.devices import EchoDevice

pytestmark = pytest.mark.timeout(240)

# The last commit whose collector speaks protocol 1 only (no offer, no version header, v: 1 frames,
# no bye). Its `collector` and `common` packages are taken from git history, byte for byte.
PROTOCOL_1_COLLECTOR = "ea52cc47226a47bc85b550925da61172e4689812"
REPO = Path(__file__).resolve().parents[2]


def _old_collector_tree(into: Path) -> Path:
    """The protocol-1 collector's sources, extracted from the repository's history."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", PROTOCOL_1_COLLECTOR, "collector", "common"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert archive.returncode == 0, (
        "this test runs the protocol-1 collector from git history; the checkout needs commit "
        f"{PROTOCOL_1_COLLECTOR}: {archive.stderr.decode(errors='replace')}"
    )
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


@pytest.fixture
def mixed(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[ControlPlane, Collector, Collector, Platform]]:
    cp = shared_control_plane
    old_tree = _old_collector_tree(tmp_path / "protocol-1")
    # The old tree first on the path, and not the working directory (PYTHONSAFEPATH): `python -m
    # collector` is then the old collector, whole, with the same installed dependencies.
    old_env = {"PYTHONPATH": str(old_tree), "PYTHONSAFEPATH": "1"}
    old = Collector(cp, tmp_path / "old", tmp_path / "old.log", env=old_env)
    new = Collector(cp, tmp_path / "new", tmp_path / "new.log")
    platform = Platform(cp)
    yield cp, old, new, platform
    for c in (old, new):
        c.stop()
    platform.close()


def _shown(cp: ControlPlane, collector_id: str) -> Any:
    return cp.api.collector(collector_id)


def test_an_old_collector_runs_beside_a_new_one_and_only_the_new_one_says_goodbye(
    mixed: tuple[ControlPlane, Collector, Collector, Platform],
) -> None:
    cp, old, new, platform = mixed
    old_id = old.enroll()
    new_id = new.enroll(old.site_id)
    # The old collector really is the old code: its client has no protocol negotiation.
    probe = subprocess.run(
        [sys.executable, "-c", "import collector.client as c; print(hasattr(c, 'read_claim_answer'))"],
        env=old._env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert probe.stdout.strip() == "False"
    old.start()
    new.start()
    wait_for(lambda: _shown(cp, old_id)["session"].get("session_id") is not None, timeout=60)
    wait_for(lambda: _shown(cp, new_id)["session"].get("protocol_version") == protocol.PROTOCOL_VERSION)
    wait_for(lambda: _shown(cp, old_id)["session"].get("protocol_version") == 1)
    # Both keep running work: an older collector is never refused for being older.
    # Devices whose placement (rendezvous hash, both collectors idle) lands on each of them in turn.
    prefers_old = [t for i in range(200) if _rendezvous(t := f"dev-{i}", old_id) > _rendezvous(t, new_id)]
    prefers_new = [t for i in range(200) if _rendezvous(t := f"dev-{i}", new_id) > _rendezvous(t, old_id)]
    holders = set()
    for i, target in enumerate([*prefers_old[:3], *prefers_new[:3]]):
        task_id = platform.submit(old.site_id, "echo", "read", target, {"i": i}, f"mixed-{i}")
        task = platform.wait_state(task_id, {"success", "failed"})
        assert task.state == task_pb2.TASK_STATE_SUCCESS, task.error_code
        # Placement names its collector in the move to routed ("collector <id>").
        routed = [t for t in task.history if t.to_state == task_pb2.TASK_STATE_ROUTED]
        holders |= {t.reason.removeprefix("collector ") for t in routed}
    assert holders == {old_id, new_id}, holders
    # A clean stop of the new collector says goodbye: offline, with its reason, at once.
    new.signal(signal.SIGTERM)
    assert new.stop() == 0
    shown = _shown(cp, new_id)
    assert (shown["session_state"], shown["session"].get("goodbye_reason")) == (
        "SESSION_STATE_OFFLINE",
        "shutdown",
    )
    assert "said goodbye" in new.log()
    # The old collector cannot say goodbye: after its stop it is still seen as live, as before.
    assert old.stop() == 0
    assert _shown(cp, old_id)["session_state"] in ("SESSION_STATE_ACTIVE", "SESSION_STATE_STALE")


def test_tasks_needing_a_newer_feature_go_only_to_the_new_collector_and_the_wait_names_the_floor(
    mixed: tuple[ControlPlane, Collector, Collector, Platform],
) -> None:
    cp, old, new, platform = mixed
    old_id = old.enroll()
    new_id = new.enroll(old.site_id)
    old.start()
    wait_for(lambda: _shown(cp, old_id)["session"].get("protocol_version") == 1, timeout=60)
    # Only the old collector is live: a task that needs cancel waits, and says which floor it needs.
    waiting = platform.submit(old.site_id, "echo", "read", "dev-w", {}, "floor-wait", features=["cancel"])
    wait_for(lambda: platform.task(waiting).task.condition == f"needs protocol ≥ {FLOOR} for cancel")
    assert platform.task(waiting).task.state == task_pb2.TASK_STATE_QUEUED
    new.start()
    wait_for(lambda: _shown(cp, new_id)["session"].get("protocol_version") == protocol.PROTOCOL_VERSION)
    assert _holder(platform.wait_state(waiting, {"success"})) == new_id
    # Devices whose placement would favour the old collector: plain work goes there, work that
    # needs the feature never does.
    prefers_old = [t for i in range(300) if _rendezvous(t := f"dev-{i}", old_id) > _rendezvous(t, new_id)]
    for i, target in enumerate(prefers_old[:3]):
        needs = platform.submit(old.site_id, "echo", "read", target, {"i": i}, f"f-{i}", features=["cancel"])
        assert _holder(platform.wait_state(needs, {"success"})) == new_id
        plain = platform.submit(old.site_id, "echo", "read", target, {"i": i}, f"p-{i}")
        assert _holder(platform.wait_state(plain, {"success"})) == old_id
    # A collector outside the range this control plane speaks is refused, and told the range.
    answer = _claim_as(cp, old, {"min": protocol.PROTOCOL_VERSION + 1, "max": protocol.PROTOCOL_VERSION + 5})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"]) == (400, "version_unsupported")
    assert error["details"] == {"min": protocol.MIN_PROTOCOL_VERSION, "max": protocol.PROTOCOL_VERSION}


FLOOR = protocol.floor_of("cancel")


def _holder(task: Any) -> str:
    """The collector that ran the task (placement names it in the move to routed)."""
    routed = [t for t in task.history if t.to_state == task_pb2.TASK_STATE_ROUTED]
    return str(routed[-1].reason.removeprefix("collector "))


def _claim_as(cp: ControlPlane, c: Collector, offer: dict[str, int]) -> httpx.Response:
    """A claim signed with the enrolled collector's own key, offering ``offer``, to the real gateway."""
    paths = StatePaths(c.state)
    identity = json.loads(paths.identity.read_text())
    key = load_key(paths.key)
    with httpx.Client(base_url=identity["gateway_url"], verify=ssl_context(paths), timeout=30) as client:
        return client.post(
            "/api/collector/v1/claim",
            json={"wait_s": 0, "session_id": "s-future", "protocol": offer},
            auth=SignRequests(key, identity["collector_id"]),
        )


def test_a_protocol_1_collector_still_carries_a_tunnel(
    mixed: tuple[ControlPlane, Collector, Collector, Platform], tmp_path: Path
) -> None:
    """The collector from before resumable tunnels dials back without naming a tunnel protocol: the
    gateway speaks protocol 1 to it (64 KiB frames, no acknowledgements), and `versus-cp tunnel`
    attaching directly to that gateway moves bytes through it exactly."""
    cp, old, _, _ = mixed
    old.enroll()
    echo = EchoDevice()
    payload = os.urandom(3 * 1024 * 1024 + 17)
    mark = cp.log_mark()
    try:
        old.start()
        wait_for(lambda: "capabilities published" in old.log(), timeout=60)
        done = subprocess.run(
            [sys.executable, "-m", "versus_cp", "tunnel", "--target", f"127.0.0.1:{echo.port}",
             "--site", old.site_id, "--tenant", "acme"],
            env=cp.env, input=payload, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout == payload
        assert "tunnel open" in old.log()
        taken = [line for line in cp.log_since(mark).splitlines() if "tunnel taken" in line]
        assert len(taken) == 1 and "protocol=1" in taken[0], taken
    finally:
        echo.close()
