"""The audit export drill: every audit event reaches a real rsyslog (RFC 5425, TLS), an HMAC-checking
webhook and a file, through both receivers going down for a while and the router SIGKILLed while it
delivers — at least once (a duplicate only ever repeats an id), in commit order per source, with
no secret in any of them. PostgreSQL's audit log is the truth the sinks are compared with."""

from __future__ import annotations

import json
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.harness import ControlPlane
from tests.support.receivers import receivers


def _db(state: Path) -> str:
    """The running `up`'s PostgreSQL, as it recorded it (the embedded server's socket directory is
    shortened when the state directory's path is too long for a socket)."""
    return str(json.loads((state / "endpoints.json").read_text())["database_url"])


def _logged(state: Path) -> list[tuple[str, str]]:
    """Every audit row as (source service, id), in the export's order."""
    with psycopg.connect(_db(state)) as conn:
        rows = conn.execute("SELECT service, id FROM audit_events ORDER BY xid, id").fetchall()
    return [(str(service), str(event_id)) for service, event_id in rows]


def _file_events(path: Path) -> list[dict[str, Any]]:
    files = [*sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:])), path]
    return [json.loads(line) for f in files if f.exists() for line in f.read_text().splitlines()]


def _check(name: str, got: list[dict[str, Any]], logged: list[tuple[str, str]], leaks: list[str]) -> None:
    firsts: dict[str, dict[str, Any]] = {}
    for event in got:
        if event["id"] in firsts:
            assert firsts[event["id"]] == event, f"{name}: id {event['id']} repeated with other content"
        firsts.setdefault(event["id"], event)
    assert set(firsts) == {i for _, i in logged}, (
        f"{name}: missing {sorted({i for _, i in logged} - set(firsts))}"
    )
    order = {i: n for n, (_, i) in enumerate(logged)}
    for source in {s for s, _ in logged}:
        seen = [order[e["id"]] for e in firsts.values() if e["source"] == f"/versus/{source}"]
        assert seen == sorted(seen), f"{name}: events of {source} out of order"
    text = json.dumps(got)
    assert not [leak for leak in leaks if leak in text], f"{name}: a secret left in an event"


@pytest.mark.timeout(240)
def test_every_audit_event_reaches_every_sink_through_outages_and_a_killed_router(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    secret = secrets.token_hex(32).encode()
    (tmp_path / "webhook.secret").write_bytes(secret + b"\n")
    audit_file = tmp_path / "audit" / "events.jsonl"
    state = tmp_path / "state"
    with receivers(tmp_path / "receivers", secret) as (syslog, webhook, tls):
        env = {
            "VERSUS_AUDIT_FILE": str(audit_file), "VERSUS_AUDIT_FILE_MAX_BYTES": str(1024 * 1024),
            "VERSUS_AUDIT_SYSLOG": f"127.0.0.1:{syslog.port}", "VERSUS_AUDIT_SYSLOG_CA_FILE": str(tls.ca),
            "VERSUS_AUDIT_WEBHOOK_URL": webhook.url, "VERSUS_AUDIT_WEBHOOK_CA_FILE": str(tls.ca),
            "VERSUS_AUDIT_WEBHOOK_SECRET_FILE": str(tmp_path / "webhook.secret"),
        }  # fmt: skip
        leaks: list[str] = []

        def burst(cp: ControlPlane, tag: str, n: int) -> None:
            for i in range(n):
                site = cp.api.create_site(f"audit-{tag}-{i}")["site"]["site_id"]
                if i % 5 == 0:  # a token's plaintext must never leave in an event
                    leaks.append(cp.api.issue_token(site)["plaintext"])

        def lagging() -> dict[str, int]:
            """How many logged events each sink still lacks (sinks lacking none left out)."""
            ids = {i for _, i in _logged(state)}
            sinks = {"syslog": syslog.events(), "webhook": webhook.events, "file": _file_events(audit_file)}
            missing = {name: len(ids - {e["id"] for e in got}) for name, got in sinks.items()}
            return {name: n for name, n in missing.items() if n}

        def delivered() -> bool:
            return not lagging()

        def settle(timeout: float = 60) -> None:
            deadline = time.monotonic() + timeout
            while behind := lagging():
                if time.monotonic() > deadline:
                    said = [line for line in cp.log().splitlines() if "audit" in line]
                    raise AssertionError(f"the sinks did not catch up: {behind}\n" + "\n".join(said[-30:]))
                time.sleep(0.3)

        cp = start_control_plane(state, **env)
        burst(cp, "a", 10)
        settle()
        # Both receivers down for a while: the events wait in PostgreSQL.
        syslog.stop()
        webhook.down = True
        burst(cp, "b", 10)
        time.sleep(2)
        assert not delivered()
        # Back, the webhook slow to answer: the router is SIGKILLed after the webhook stored a batch
        # and before it answered; `up` stops, and starts again.
        webhook.hold_s = 5.0
        stored = len(webhook.events)
        syslog.start()
        webhook.down = False
        burst(cp, "c", 10)
        deadline = time.monotonic() + 30
        while len(webhook.events) == stored:
            assert time.monotonic() < deadline, "no delivery began"
            time.sleep(0.05)
        (router,) = [p for p in cp.descendants() if "router" in p.cmdline()]
        router.send_signal(signal.SIGKILL)
        assert cp.wait(timeout=60) != 0
        webhook.hold_s = 0.0
        cp = start_control_plane(state, **env)
        burst(cp, "d", 10)
        settle()
        logged = _logged(state)
        assert len(logged) >= 40
        _check("syslog", syslog.events(), logged, leaks)
        _check("webhook", webhook.events, logged, leaks)
        _check("file", _file_events(audit_file), logged, leaks)
        assert webhook.refused == 0  # every delivery carried a good signature
        # The batch the killed router was delivering came again: at least once, the same ids.
        ids = [e["id"] for e in webhook.events]
        assert len(ids) > len(set(ids))
        # And the router says how far behind each sink is (deploy/prometheus: VersusAuditExportBehind).
        metrics = httpx.get(f"http://127.0.0.1:{cp.port('router_metrics')}/metrics", timeout=10).text
        for sink in ("file", "syslog", "webhook"):
            assert f'versus_audit_export_oldest_undelivered_age_seconds{{sink="{sink}"}}' in metrics
            assert f'versus_audit_export_delivered_total{{sink="{sink}"}}' in metrics
        cp.stop()
