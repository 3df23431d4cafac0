"""The audit page's filters, subject links and exports, fed values."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest

from console.audit_views import AuditFilters, export_csv, export_json, subject_href
from console.task_views import FilterInvalid
from console.views import AuditEntry


def test_a_range_of_days_is_both_days_included() -> None:
    f = AuditFilters.parse({"start": "2026-12-01", "end": "2026-12-03", "actor": " alice "})
    since, until = f.window()
    assert since == dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    assert until == dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    assert f.actor == "alice"
    assert AuditFilters.parse({}).window() == (None, None)
    assert "start=2026-12-01" in f.query() and "page=p" in f.query(page="p")


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"start": "yesterday"}, "date_invalid"),
        ({"start": "2026-12-03", "end": "2026-12-01"}, "time_range_invalid"),
    ],
)
def test_a_bad_range_is_refused_with_its_code(query: dict[str, str], code: str) -> None:
    with pytest.raises(FilterInvalid) as refused:
        AuditFilters.parse(query)
    assert refused.value.code == code


def test_subjects_link_to_their_pages() -> None:
    assert subject_href("collector", "col-1") == "/collectors/col-1"
    assert subject_href("task", "tsk-1") == "/tasks/tsk-1"
    assert subject_href("site", "a b") == "/sites/a%20b"
    assert subject_href("api_token", "tok-1") == "" and subject_href("collector", "") == ""


def test_exports_keep_every_event_and_run_nothing_in_a_spreadsheet() -> None:
    entries = [
        AuditEntry(
            "2026-12-06 12:00:00",
            "=cmd|' /C calc'!A0",
            "collector.drain",
            "collector",
            "col-1",
            '{"reason": "x"}',
        )
    ]
    [row] = list(csv.DictReader(io.StringIO(export_csv(entries))))
    assert row["actor"].startswith("'=") and row["action"] == "collector.drain"
    assert json.loads(export_json(entries))[0]["details"] == {"reason": "x"}
