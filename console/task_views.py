"""Tasks as the console shows them: the list's filters, a row per task, one task with its attempts,
result and output, and the conversion from the task router's messages (pages never see protobuf).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields

from versus.router.v1 import task_pb2

from console.queue_views import OP_CLASS, DispatchView, Step, state_name
from console.views import timestamp

_S = task_pb2
# The state filter's choices -> the task states each stands for.
STATE_GROUPS: dict[str, list[task_pb2.TaskState.ValueType]] = {
    "all": [],
    "waiting": [_S.TASK_STATE_QUEUED],
    "in_flight": [
        _S.TASK_STATE_ROUTED, _S.TASK_STATE_LEASED, _S.TASK_STATE_DISPATCHED, _S.TASK_STATE_RUNNING,
        _S.TASK_STATE_UNKNOWN, _S.TASK_STATE_RECONCILING,
    ],
    "success": [_S.TASK_STATE_SUCCESS],
    "failed": [_S.TASK_STATE_FAILED],
    "indeterminate": [_S.TASK_STATE_INDETERMINATE],
    "expired": [_S.TASK_STATE_EXPIRED],
    "cancelled": [_S.TASK_STATE_CANCELLED],
}  # fmt: skip
STATE_LABELS = {
    "all": "All", "waiting": "Waiting (queued)", "in_flight": "In flight", "success": "Succeeded",
    "failed": "Failed", "indeterminate": "Indeterminate", "expired": "Expired", "cancelled": "Cancelled",
}  # fmt: skip
# How far back the list looks (the default keeps the first page about recent work).
SINCE: dict[str, dt.timedelta | None] = {
    "1h": dt.timedelta(hours=1), "24h": dt.timedelta(days=1), "7d": dt.timedelta(days=7), "all": None,
}  # fmt: skip
DEFAULT_SINCE = "24h"
SETTLED = frozenset({"success", "failed", "expired", "cancelled", "indeterminate"})
# What a queued task's condition code means, in an operator's words.
CONDITIONS = {
    "no_eligible_collector": "no eligible collector: none at its site is active, online, undrained and "
    "offers this operation",
    "no_collector_holds_a_live_dispatch_key": "no eligible collector holds a live dispatch key "
    "(a key rotation it has not caught up with)",
}
RESULT_SHOWN = 64 * 1024
MAX_TEXT_FILTER = 200


class FilterInvalid(ValueError):
    """A filter value the list cannot take: (code, message)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def day_window(start: str, end: str) -> tuple[dt.datetime | None, dt.datetime | None]:
    """Two UTC days (YYYY-MM-DD, both included, either may be empty) as [since, until) instants;
    a malformed or backwards range is refused (``date_invalid``, ``time_range_invalid``)."""
    try:
        since = dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC) if start else None
        last = dt.datetime.fromisoformat(end).replace(tzinfo=dt.UTC) if end else None
    except ValueError:
        raise FilterInvalid("date_invalid", "dates are YYYY-MM-DD") from None
    until = last + dt.timedelta(days=1) if last is not None else None
    if since is not None and until is not None and until <= since:
        raise FilterInvalid("time_range_invalid", "the range ends before it starts")
    return since, until


@dataclass(frozen=True)
class TaskFilters:
    """The Tasks page's filters, as in its query string."""

    state: str = "all"
    site: str = ""
    tenant: str = ""
    provider: str = ""
    operation: str = ""
    target: str = ""
    label: str = ""
    since: str = DEFAULT_SINCE
    # Days (YYYY-MM-DD, UTC), both included; either set replaces ``since``.
    start: str = ""
    end: str = ""

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> TaskFilters:
        got = {f.name: query.get(f.name, "").strip()[:MAX_TEXT_FILTER] for f in fields(cls)}
        got["state"] = got["state"] or "all"
        got["since"] = got["since"] or DEFAULT_SINCE
        if got["state"] not in STATE_GROUPS:
            raise FilterInvalid("state_invalid", f"state must be one of {', '.join(STATE_GROUPS)}")
        if got["since"] not in SINCE:
            raise FilterInvalid("since_invalid", f"since must be one of {', '.join(SINCE)}")
        if got["label"] and "=" not in got["label"]:
            raise FilterInvalid("labels_invalid", "a label filter is KEY=VALUE")
        parsed = cls(**got)
        parsed.window(dt.datetime.now(dt.UTC))  # refuses a malformed or backwards range now
        return parsed

    @property
    def labels(self) -> dict[str, str]:
        if not self.label:
            return {}
        key, _, value = self.label.partition("=")
        return {key: value}

    def window(self, now: dt.datetime) -> tuple[dt.datetime | None, dt.datetime | None]:
        """When the listed tasks were created, as [after, before): the days when given, else the
        ``since`` preset back from ``now``."""
        if not (self.start or self.end):
            preset = SINCE[self.since]
            return (None if preset is None else now - preset), None
        return day_window(self.start, self.end)

    def query(self, **changes: str) -> str:
        """This filter as a query string (with ``changes``), for links and the next page."""
        values = {**asdict(self), **changes}
        return urllib.parse.urlencode({k: v for k, v in values.items() if v})


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    state: str
    why: str
    site_id: str
    tenant_id: str
    provider: str
    operation: str
    op_class: str
    target_ref: str
    collector_id: str
    attempts: int
    created_at: str
    updated_at: str
    elapsed: str
    error_code: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        return self.state in SETTLED


@dataclass(frozen=True)
class TaskPage:
    tasks: list[TaskRow]
    next_page_token: str


@dataclass(frozen=True)
class TaskDetail:
    row: TaskRow
    idempotency_key: str
    deadline: str
    features: list[str]
    requires_fips: bool
    evidence: str
    condition: str
    cancel_requested_at: str
    result: str
    result_binary: bool
    result_length: int
    output_length: int
    output_sha256: str
    history: list[Step]
    attempts: list[DispatchView]

    @property
    def cancellable(self) -> bool:
        return not self.row.settled and not self.cancel_requested_at

    @property
    def terminal_mutation(self) -> bool:
        return self.row.op_class == "mutate_terminal"


def condition_text(code: str) -> str:
    """An operator's words for a queued task's condition (unknown codes as they are)."""
    return CONDITIONS.get(code, code)


def _elapsed(t: task_pb2.Task, now: dt.datetime) -> str:
    start = t.created_at.ToDatetime(dt.UTC)
    end = t.updated_at.ToDatetime(dt.UTC) if state_name(t.state) in SETTLED else now
    seconds = max(0, int((end - start).total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def task_row(t: task_pb2.Task, now: dt.datetime) -> TaskRow:
    state = state_name(t.state)
    why = condition_text(t.condition) if state == "queued" else t.error_code
    return TaskRow(
        task_id=t.task_id, state=state, why=why, site_id=t.site_id, tenant_id=t.tenant_id,
        provider=t.provider, operation=t.operation, op_class=OP_CLASS.get(t.op_class, "—"),
        target_ref=t.target_ref, collector_id=t.collector_id, attempts=t.attempts,
        created_at=timestamp(t.created_at), updated_at=timestamp(t.updated_at), elapsed=_elapsed(t, now),
        error_code=t.error_code, labels=dict(sorted(t.labels.items())),
    )  # fmt: skip


def result_shown(data: bytes) -> tuple[str, bool]:
    """The result as text when it is UTF-8 (JSON pretty-printed), else a hex dump; and whether it
    was binary. At most :data:`RESULT_SHOWN` bytes are shown."""
    head = data[:RESULT_SHOWN]
    try:
        text = head.decode()
    except UnicodeDecodeError:
        return head.hex(" ", 2), True
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False), False
    except ValueError:
        return text, False


def task_detail(t: task_pb2.Task, attempts: Sequence[DispatchView], now: dt.datetime) -> TaskDetail:
    text, binary = result_shown(t.result)
    return TaskDetail(
        row=task_row(t, now), idempotency_key=t.idempotency_key, deadline=timestamp(t.deadline),
        features=list(t.features), requires_fips=t.requires_fips, evidence=t.evidence,
        condition=condition_text(t.condition) if t.condition else "",
        cancel_requested_at=timestamp(t.cancel_requested_at) if t.HasField("cancel_requested_at") else "",
        result=text, result_binary=binary, result_length=len(t.result), output_length=t.output_length,
        output_sha256=t.output_sha256,
        history=[
            Step(timestamp(h.at), state_name(h.from_state), state_name(h.to_state), h.reason, h.dispatch_id)
            for h in t.history
        ],
        attempts=list(attempts),
    )  # fmt: skip


EXPORT_FIELDS = [f.name for f in fields(TaskRow)]


def csv_cell(value: object) -> str:
    """A value as a CSV cell a spreadsheet will not run: text starting like a formula gets a quote."""
    text = str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def export_csv(rows: Sequence[TaskRow]) -> str:
    """The rows as CSV (labels as K=V pairs joined by ';')."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(EXPORT_FIELDS)
    for row in rows:
        values = asdict(row)
        values["labels"] = ";".join(f"{k}={v}" for k, v in row.labels.items())
        writer.writerow([csv_cell(values[name]) for name in EXPORT_FIELDS])
    return out.getvalue()


def export_json(rows: Sequence[TaskRow]) -> str:
    return json.dumps([asdict(row) for row in rows], indent=1)
