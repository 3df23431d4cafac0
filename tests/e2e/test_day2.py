"""Day 2: a real collector outlives its certificates, renewing them while tasks flow (docs/day2.md)."""

from __future__ import annotations

import calendar
import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from collector.renewal import leaf_not_after
from common import pki
from tests.e2e.collector_harness import Collector, Platform, cli_json, wait_for
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


class Tasks:
    """Echo tasks, one at a time, to the collector named: returns the error code ("" on success)."""

    def __init__(self, cp: ControlPlane, prefix: str):
        self.platform = Platform(cp)
        self.prefix = prefix
        self.n = 0

    def __call__(self, c: Collector) -> str:
        self.n += 1
        task_id = self.platform.submit(
            c.site_id, "echo", "read", "dev-1", {"n": self.n}, f"{self.prefix}-{self.n}"
        )
        done = {"success", "failed", "expired", "indeterminate"}
        return str(self.platform.wait_state(task_id, done, 90).error_code)


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


def _trust(c: Collector) -> dict[str, Any]:
    held: dict[str, Any] = json.loads((c.state / "trust.json").read_text())
    return held


def _issuer(c: Collector) -> str:
    return pki.issuer_id(x509.load_pem_x509_certificates((c.state / "cert.pem").read_bytes())[0])


def _served_issuer(cp: ControlPlane) -> str:
    """Who issued the certificate the gateway presents to a new connection now."""
    pem = ssl.get_server_certificate(("127.0.0.1", cp.port("gateway")), timeout=5)
    return pki.issuer_id(x509.load_pem_x509_certificate(pem.encode()))


@pytest.mark.timeout(300)
def test_the_collector_ca_and_the_gateway_ca_rotate_with_overlap_while_tasks_flow(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    # Two-minute certificates: a collector renews one of a retired issuer within 5 % of that (6 s).
    cp = start_control_plane(VERSUS_COLLECTOR_CERT_LIFETIME_S="120")
    online = Collector(cp, tmp_path / "online", tmp_path / "online.log")
    away = Collector(cp, tmp_path / "away", tmp_path / "away.log")
    ids = {online.enroll(), away.enroll()}
    # An enroll command printed before the rotation pins the gateway CA of that time.
    early = cli_json(["tokens", "issue", "--site", online.site_id], cp.env)
    online.start()
    away.start()
    task = Tasks(cp, "ca")

    def ca(*args: str, ok: bool = True) -> str:
        done = run_cli(["ca", *args], cp.env)
        assert (done.returncode == 0) == ok, done.stdout + done.stderr
        return done.stdout + done.stderr

    def flow_until(done: Callable[[], bool], *who: Collector, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "".join(c.log() for c in who)
            for c in who:
                assert task(c) == ""

    try:
        assert task(online) == "" and task(away) == ""
        status = json.loads(ca("status", "--json"))
        old_collector, old_gateway = status["collector"]["active"], status["gateway"]["active"]
        assert _trust(online)["version"] == 1 and _issuer(online) == old_collector
        away.stop()

        # Collector CA: add, let collectors learn it, make it issue; online renews under it at once.
        ca("rotate", "--ca", "collector")
        new_collector = next(c["id"] for c in json.loads(ca("status", "--json"))["collector"]["cas"]
                             if c["id"] != old_collector)  # fmt: skip
        flow_until(lambda: _trust(online)["version"] == 2, online)
        ca("activate", "--ca", "collector", new_collector)
        flow_until(lambda: _issuer(online) == new_collector, online)
        # The collector that is away still holds a certificate of the old CA: it may not be retired.
        status = json.loads(ca("status", "--json"))
        away_id = identity(away)
        assert [c["issued_to"] for c in status["collector"]["cas"]] == [[away_id], [identity(online)]]
        assert "ca_in_use" in ca("retire", "--ca", "collector", old_collector, ok=False)

        # Gateway CA: added beside the old one; switching is refused while a collector lacks it.
        ca("rotate", "--ca", "gateway")
        new_gateway = json.loads(ca("status", "--json"))["gateway"]["cas"][-1]["id"]
        flow_until(lambda: _trust(online)["version"] == 4, online)
        refused = ca("activate", "--ca", "gateway", new_gateway, ok=False)
        assert "ca_not_held" in refused and away_id in refused

        # Back after two rotations: it takes the newest bundle and renews under the new Collector CA.
        away.start()
        flow_until(lambda: _trust(away)["version"] == 4 and _issuer(away) == new_collector, away, online)
        assert _served_issuer(cp) == old_gateway
        ca("activate", "--ca", "gateway", new_gateway)
        wait_for(lambda: _served_issuer(cp) == new_gateway, timeout=10)
        assert task(online) == "" and task(away) == ""
        # The old pin still enrolls: the old CA certified its successor.
        late = Collector(cp, tmp_path / "late", tmp_path / "late.log")
        late.enroll(online.site_id, issued=early)
        assert _trust(late)["version"] == 5

        # Nobody depends on the old CAs any more: retire both; collectors drop them (and restart to).
        ca("retire", "--ca", "collector", old_collector)
        ca("retire", "--ca", "gateway", old_gateway)
        flow_until(
            lambda: _trust(online)["version"] == _trust(away)["version"] == 7, online, away, timeout=90
        )
        for c in (online, away):
            bundle = {
                pki.ca_id(x)
                for x in x509.load_pem_x509_certificates((c.state / "ca-bundle.pem").read_bytes())
            }
            assert bundle == {new_collector, new_gateway}
            assert "restarting to stop trusting it" in c.log()
            assert task(c) == ""
            assert "trust bundle refused" not in c.log()
        # No re-enrollment: the same identities all along.
        assert {identity(online), identity(away)} == ids
    finally:
        task.platform.close()
        online.stop()
        away.stop()


def identity(c: Collector) -> str:
    return str(json.loads((c.state / "identity.json").read_text())["collector_id"])
