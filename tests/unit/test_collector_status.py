"""``versus-collector status`` from a state directory alone (collector/status.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from collector.status import local_status, render
from tests.support.pki import p256

NOW = 1_800_000_000.0


def _cert(not_after: dt.datetime) -> bytes:
    key = p256()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "col-1")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(not_after - dt.timedelta(days=90)).not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM)


def _state(tmp_path: Path, **runtime: object) -> Path:
    (tmp_path / "identity.json").write_text(
        json.dumps({"collector_id": "col-1", "site_id": "site-a", "status": "active",
                    "gateway_url": "https://gw.example:8443"})
    )  # fmt: skip
    (tmp_path / "cert.pem").write_bytes(_cert(dt.datetime.fromtimestamp(NOW + 30 * 86400, dt.UTC)))
    if runtime:
        (tmp_path / "runtime.json").write_text(json.dumps(runtime))
    return tmp_path


def test_a_running_collector_says_its_session_work_certificate_and_update(tmp_path: Path) -> None:
    state = _state(
        tmp_path, last_claim_at=NOW - 4, pid=os.getpid(), agent_version="1.4.0", session_id="s-abc",
        protocol=7, transport="websocket", vault_mode="local", in_flight={"ssh": 2},
        clock_offset_s=0.012, clock_uncertainty_s=0.003,
    )  # fmt: skip
    (state / "update-status.json").write_text(
        json.dumps({"state": "rolled_back", "version": "1.5.0", "detail": "update_start_failed: exit 3"})
    )
    facts = local_status(state, now=NOW)
    assert facts["process"] == {"pid": os.getpid(), "alive": True, "agent_version": "1.4.0", "running": True}
    assert facts["session"]["in_flight"] == {"ssh": 2} and facts["session"]["protocol"] == 7
    assert facts["certificate"]["expires_in_s"] == 30 * 86400
    assert facts["journal"] == {"received": 0, "results": 0, "held": 0}
    facts["enrollment"] = {"status": "active"}
    assert render(facts, now=NOW) == [
        "col-1 in site site-a",
        "enrollment: active (the control plane says)",
        "gateway: https://gw.example:8443",
        f"process: running (pid {os.getpid()}, version 1.4.0)",
        "session: s-abc, protocol 7 over websocket, vault mode local; last claim 4s ago",
        "tasks: running ssh 2; journal 0 received, 0 held (in flight or not yet reported)",
        "clock: server time = local +0.012s (within 0.003s)",
        f"certificate: valid until {dt.datetime.fromtimestamp(NOW + 30 * 86400, dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
        " (30.0 days)",
        "update: rolled_back 1.5.0 - update_start_failed: exit 3",
    ]


def test_a_stopped_collector_and_an_unreachable_gateway_still_give_the_local_facts(tmp_path: Path) -> None:
    # A pid that is not running (pid_max is below 2**22 on Linux), a claim long ago.
    state = _state(tmp_path, last_claim_at=NOW - 3600, pid=2**22 + 1)
    facts = local_status(state, now=NOW)
    assert facts["process"]["alive"] is False and facts["process"]["running"] is False
    facts["enrollment"] = {"error": {"code": "gateway_unreachable", "message": "connection refused"}}
    lines = render(facts, now=NOW)
    assert lines[1] == "enrollment: active when last known (gateway_unreachable: connection refused)"
    assert lines[3].startswith("process: not running")
    assert "last claim 3600s ago" in lines[4]
    assert lines[-1] == "update: nothing reported"


def test_a_collector_that_never_claimed(tmp_path: Path) -> None:
    facts = local_status(_state(tmp_path), now=NOW)
    assert facts["session"]["last_claim_at"] is None and facts["process"]["running"] is False
    assert "last claim never" in render(facts, now=NOW)[4]
