"""An audit row as it leaves (pure): a CloudEvents 1.0 event, its JSON line, its RFC 5424 syslog
frame, and the webhook's HMAC signature.

The event id is the audit row's id, unique per deployment and the same on every delivery, so a
receiver removes the duplicates at-least-once delivery can bring by ``(source, id)``. Details go
through the same redaction as log lines: a secret never leaves in an event.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

from common.telemetry.redaction import redact

SPEC_VERSION = "1.0"
TYPE_PREFIX = "com.versus.audit."
# Syslog: facility 13 (log audit), severity 5 (notice) (RFC 5424 section 6.2.1).
PRI = 13 * 8 + 5
_MSGID_MAX = 32
SIGNATURE_HEADER = "X-Versus-Signature"
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"


def cloud_event(row: Mapping[str, Any], deployment: str) -> dict[str, Any]:
    """The CloudEvents form of one audit row (``audit_events`` columns)."""
    at: dt.datetime = row["at"]
    return {
        "specversion": SPEC_VERSION,
        "id": str(row["id"]),
        "source": f"/{deployment}/{row['service']}",
        "type": TYPE_PREFIX + str(row["action"]),
        "subject": f"{row['subject_type']}/{row['subject_id']}",
        "time": at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        "data": {
            "actor": row["actor"],
            "action": row["action"],
            "subject_type": row["subject_type"],
            "subject_id": row["subject_id"],
            "request_id": row["request_id"],
            "details": redact(dict(row["details"] or {})),
        },
    }


def json_line(event: Mapping[str, Any]) -> bytes:
    """One event as a line of JSON (the file sink's record)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def syslog_frame(event: Mapping[str, Any], hostname: str, app_name: str, procid: int) -> bytes:
    """One event as an RFC 5424 message, octet-counted for a TCP or TLS transport (RFC 5425).

    The message is the event's JSON; the MSGID is the action (printable ASCII, at most 32)."""
    msgid = "".join(c for c in str(event["data"]["action"]) if 33 <= ord(c) <= 126)[:_MSGID_MAX] or "-"
    header = f"<{PRI}>1 {event['time']} {_field(hostname, 255)} {_field(app_name, 48)} {procid} {msgid} -"
    message = header.encode() + b" \xef\xbb\xbf" + json_line(event).rstrip(b"\n")
    return f"{len(message)} ".encode() + message


def _field(value: str, limit: int) -> str:
    printable = "".join(c for c in value if 33 <= ord(c) <= 126)[:limit]
    return printable or "-"


def batch_body(events: Sequence[Mapping[str, Any]]) -> bytes:
    """A webhook delivery: the events as a CloudEvents JSON batch."""
    return json.dumps(list(events), separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>." + body>``: the receiver recomputes it with the
    shared secret and refuses a delivery whose time is far from its own (a replay)."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify_signature(secret: bytes, header: str, body: bytes, now: int, tolerance_s: int = 300) -> bool:
    """What a receiver checks (documented, and used by the tests' receiver)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), header)
