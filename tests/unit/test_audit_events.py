"""Audit events as they leave (router/audit_export/events.py): CloudEvents, syslog frames, signatures."""

from __future__ import annotations

import datetime as dt
import json

from router.audit_export import events

ROW = {
    "id": 4217, "xid": 991, "at": dt.datetime(2026, 12, 6, 5, 30, 1, 250000, tzinfo=dt.UTC),
    "service": "router", "actor": "admin:alice", "action": "collector.revoke", "subject_type": "collector",
    "subject_id": "col-7", "request_id": "req-1",
    "details": {"reason": "stolen laptop", "token": "vst_abcdefghijklmnopqrstuvwxyz",
                "note": "Bearer abcdefghijkl"},
}  # fmt: skip


def test_an_audit_row_is_a_cloud_event_with_a_stable_id_and_no_secret() -> None:
    event = events.cloud_event(ROW, "acme-prod")
    assert event == {
        "specversion": "1.0",
        "id": "4217",
        "source": "/acme-prod/router",
        "type": "com.versus.audit.collector.revoke",
        "subject": "collector/col-7",
        "time": "2026-12-06T05:30:01.250000Z",
        "datacontenttype": "application/json",
        "data": {
            "actor": "admin:alice", "action": "collector.revoke", "subject_type": "collector",
            "subject_id": "col-7", "request_id": "req-1",
            "details": {"reason": "stolen laptop", "token": "[REDACTED]", "note": "Bearer [REDACTED]"},
        },
    }  # fmt: skip
    line = events.json_line(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and json.loads(line) == event
    assert b"vst_abc" not in line and b"abcdefghijkl" not in line


def test_a_syslog_frame_is_octet_counted_rfc_5424() -> None:
    event = events.cloud_event(ROW, "versus")
    frame = events.syslog_frame(event, "cp host", "versus", 1234)
    length, _, message = frame.partition(b" ")
    assert int(length) == len(message)
    header, _, body = message.partition(b" \xef\xbb\xbf")
    # PRI 109 = facility 13 (log audit) * 8 + severity 5 (notice); version 1; hostname without spaces.
    assert header == b"<109>1 2026-12-06T05:30:01.250000Z cphost versus 1234 collector.revoke -"
    assert json.loads(body) == event


def test_a_webhook_signature_binds_the_body_and_the_time() -> None:
    secret = b"0123456789abcdef-shared"
    body = events.batch_body([events.cloud_event(ROW, "versus")])
    header = events.signature(secret, 1_800_000_000, body)
    assert header.startswith("t=1800000000,v1=") and len(header.split("v1=")[1]) == 64
    assert events.verify_signature(secret, header, body, now=1_800_000_100)
    assert not events.verify_signature(secret, header, body + b" ", now=1_800_000_100)
    assert not events.verify_signature(b"another-secret-16b", header, body, now=1_800_000_100)
    assert not events.verify_signature(secret, header, body, now=1_800_000_000 + 301)  # too old: a replay
    assert not events.verify_signature(secret, "v1=deadbeef", body, now=1_800_000_000)
