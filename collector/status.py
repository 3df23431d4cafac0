"""What ``versus-collector status`` says about this collector, from its state directory alone.

Everything here is read from files the collector and its supervisor keep (identity, certificate,
``runtime.json`` written after every answered claim, the journal, the supervisor's upgrade report),
so the status answers while the gateway is unreachable or the collector is stopped. The enrollment
status the control plane holds is asked for separately (collector/enroll.py ``status``) and added
when it answers.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from cryptography import x509

from collector.journal import Journal
from collector.state import StatePaths, read_json
from common.runtime import pids

# A collector that claimed within this many seconds is "running" (claims are at most 55 s on
# HTTPS and 240 s on the control socket, where the socket's pings are the heartbeat).
RUNNING_WITHIN_S = 300.0


def local_status(state_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Identity, gateway, session, protocol, held tasks, journal, certificate and update state."""
    now = time.time() if now is None else now
    paths = StatePaths(state_dir)
    identity = _read(paths.identity)
    runtime = _read(paths.runtime)
    counts = {"received": 0, "results": 0, "held": 0}
    journal_path = state_dir / "journal.sqlite3"
    if journal_path.exists():
        journal = Journal(journal_path)
        try:
            counts = journal.counts()
        finally:
            journal.close()
    cert_not_after = None
    if paths.cert.exists():
        cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
        cert_not_after = cert.not_valid_after_utc.timestamp()
    said = runtime.get("last_claim_at")
    last = float(said) if isinstance(said, (int, float)) else None
    pid = runtime.get("pid")
    return {
        "collector_id": identity.get("collector_id", ""),
        "site_id": identity.get("site_id", ""),
        "enrolled_status": identity.get("status", ""),
        "gateway_url": identity.get("gateway_url", ""),
        "process": {
            "pid": pid,
            "alive": pids.running(pid),
            "agent_version": runtime.get("agent_version", ""),
            "running": last is not None and now - last <= RUNNING_WITHIN_S and pids.running(pid),
        },
        "session": {
            "session_id": runtime.get("session_id", ""),
            "protocol": runtime.get("protocol"),
            "transport": runtime.get("transport", ""),
            "vault_mode": runtime.get("vault_mode", ""),
            "last_claim_at": last,
            "in_flight": runtime.get("in_flight", {}),
        },
        "clock": {
            "offset_s": runtime.get("clock_offset_s"),
            "uncertainty_s": runtime.get("clock_uncertainty_s"),
        },
        "journal": counts,
        "certificate": {
            "not_after": cert_not_after,
            "expires_in_s": None if cert_not_after is None else cert_not_after - now,
        },
        "update": _read(paths.update_status),
    }


def render(status: dict[str, Any], now: float | None = None) -> list[str]:
    """The status as lines for a terminal."""
    now = time.time() if now is None else now
    lines = [f"{status['collector_id'] or '(not enrolled)'} in site {status['site_id'] or '-'}"]
    enrollment = status.get("enrollment")
    if isinstance(enrollment, dict) and "status" in enrollment:
        lines.append(f"enrollment: {enrollment['status']} (the control plane says)")
    elif isinstance(enrollment, dict) and "error" in enrollment:
        error = enrollment["error"]
        lines.append(
            f"enrollment: {status['enrolled_status']} when last known ({error['code']}: {error['message']})"
        )
    else:
        lines.append(f"enrollment: {status['enrolled_status']} when last known")
    lines.append(f"gateway: {status['gateway_url']}")
    process, session = status["process"], status["session"]
    state = "running" if process["running"] else "not running" if not process["alive"] else "not claiming"
    lines.append(f"process: {state} (pid {process['pid'] or '-'}, version {process['agent_version'] or '-'})")
    last = session["last_claim_at"]
    lines.append(
        f"session: {session['session_id'] or '-'}, protocol {session['protocol'] or '-'} over "
        f"{session['transport'] or '-'}, vault mode {session['vault_mode'] or '-'}; last claim "
        + (f"{now - float(last):.0f}s ago" if last else "never")
    )
    in_flight = session["in_flight"] or {}
    running = ", ".join(f"{p} {n}" for p, n in sorted(in_flight.items()) if n) or "none"
    journal = status["journal"]
    lines.append(
        f"tasks: running {running}; journal {journal['received']} received, {journal['held']} held "
        "(in flight or not yet reported)"
    )
    clock = status["clock"]
    if clock["uncertainty_s"] is None:
        lines.append("clock: local (no precise round trip with the gateway yet)")
    else:
        lines.append(
            f"clock: server time = local {clock['offset_s']:+.3f}s (within {clock['uncertainty_s']:.3f}s)"
        )
    cert = status["certificate"]
    if cert["not_after"] is None:
        lines.append("certificate: none")
    else:
        until = dt.datetime.fromtimestamp(cert["not_after"], dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines.append(f"certificate: valid until {until} ({cert['expires_in_s'] / 86400:.1f} days)")
    update = status["update"]
    if update:
        detail = f" - {update['detail']}" if update.get("detail") else ""
        lines.append(f"update: {update.get('state', '?')} {update.get('version', '')}{detail}".rstrip())
    else:
        lines.append("update: nothing reported")
    return lines


def _read(path: Path) -> dict[str, Any]:
    try:
        value = read_json(path)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
