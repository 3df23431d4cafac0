"""The Tasks pages' view logic, fed values: filters from a query string, rows from messages,
results shown safely, and exports a spreadsheet cannot be tricked by."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import urllib.parse

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from versus.router.v1 import task_pb2

from console.task_views import (
    DEFAULT_SINCE,
    FilterInvalid,
    TaskFilters,
    condition_text,
    export_csv,
    export_json,
    result_shown,
    task_row,
)

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)


def _at(when: dt.datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(when)
    return out


def _task(**changes: object) -> task_pb2.Task:
    base: dict[str, object] = {
        "task_id": "tsk-1", "provider": "stub", "operation": "echo", "op_class": task_pb2.OP_CLASS_READ,
        "target_ref": "sw-1", "site_id": "site-1", "tenant_id": "acme", "state": task_pb2.TASK_STATE_QUEUED,
        "condition": "no_eligible_collector", "created_at": _at(NOW - dt.timedelta(minutes=5)),
        "updated_at": _at(NOW - dt.timedelta(minutes=1)), "labels": {"b": "2", "a": "1"},
    }  # fmt: skip
    base.update(changes)
    return task_pb2.Task(**base)  # type: ignore[arg-type]


def test_filters_default_to_the_last_day_and_round_trip_through_the_query() -> None:
    f = TaskFilters.parse({})
    assert (f.state, f.since) == ("all", DEFAULT_SINCE)
    assert f.window(NOW) == (NOW - dt.timedelta(days=1), None)
    f = TaskFilters.parse({"state": "waiting", "site": " site-1 ", "label": "change=CHG-1", "since": "all"})
    assert (f.site, f.labels, f.window(NOW)) == ("site-1", {"change": "CHG-1"}, (None, None))
    days = TaskFilters.parse({"start": "2026-12-01", "end": "2026-12-01", "since": "1h"})
    assert days.window(NOW) == (
        dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 2, tzinfo=dt.UTC),
    )
    assert TaskFilters.parse(dict(urllib.parse.parse_qsl(f.query()))) == f
    assert "page=tok" in f.query(page="tok") and "format=csv" in f.query(format="csv")


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"state": "sideways"}, "state_invalid"),
        ({"since": "1y"}, "since_invalid"),
        ({"label": "x"}, "labels_invalid"),
    ],
)
def test_a_filter_it_cannot_take_is_refused_with_its_code(query: dict[str, str], code: str) -> None:
    with pytest.raises(FilterInvalid) as refused:
        TaskFilters.parse(query)
    assert refused.value.code == code


def test_long_filter_values_are_cut_not_sent_whole() -> None:
    assert len(TaskFilters.parse({"target": "x" * 5000}).target) == 200


def test_a_queued_row_says_why_in_words_and_a_failed_one_gives_its_code() -> None:
    row = task_row(_task(), NOW)
    assert row.state == "queued" and row.why.startswith("no eligible collector")
    assert row.elapsed == "5 min"  # still waiting: counted to now
    assert list(row.labels) == ["a", "b"]
    failed = task_row(_task(state=task_pb2.TASK_STATE_FAILED, error_code="not_applied", condition=""), NOW)
    assert (failed.why, failed.settled, failed.elapsed) == ("not_applied", True, "4 min")
    assert (
        condition_text("needs protocol \u2265 4 for output_stream")
        == "needs protocol \u2265 4 for output_stream"
    )


def test_a_result_is_shown_as_text_pretty_json_or_hex() -> None:
    assert result_shown(b'{"b":1,"a":[1,2]}') == ('{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}', False)
    assert result_shown(b"plain text") == ("plain text", False)
    shown, binary = result_shown(b"\xff\x00\x01\x02")
    assert binary and shown == "ff00 0102"
    assert len(result_shown(b"a" * 200_000)[0]) == 64 * 1024


def test_exports_hold_every_row_and_no_cell_a_spreadsheet_would_run() -> None:
    rows = [task_row(_task(task_id=f"tsk-{i}", target_ref='=HYPERLINK("x")'), NOW) for i in range(3)]
    parsed = list(csv.DictReader(io.StringIO(export_csv(rows))))
    assert [r["task_id"] for r in parsed] == ["tsk-0", "tsk-1", "tsk-2"]
    assert parsed[0]["target_ref"] == '\'=HYPERLINK("x")'
    assert parsed[0]["labels"] == "a=1;b=2"
    as_json = json.loads(export_json(rows))
    assert as_json[1]["task_id"] == "tsk-1" and as_json[1]["target_ref"] == '=HYPERLINK("x")'
