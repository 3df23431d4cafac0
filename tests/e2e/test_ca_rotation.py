"""Day 2: the Collector CA and the gateway CA rotate with overlap while tasks flow (docs/day2.md)."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from common.trust import pki
from tests.e2e.collector_harness import Collector, Tasks, wait_for
from tests.e2e.harness import ControlPlane, run_cli


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
    early = cp.api.issue_token(online.site_id)
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
