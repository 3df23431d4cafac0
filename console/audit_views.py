"""The audit log page's filters (a subject, an actor, an action prefix and a range of days) and its
exports. Pure."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from console.task_views import csv_cell, day_window
from console.views import AuditEntry

# Where a subject of each type is shown in the console (others are shown as text).
SUBJECT_PAGES = {"collector": "/collectors/", "task": "/tasks/", "site": "/sites/"}


@dataclass(frozen=True)
class AuditFilters:
    subject: str = ""
    actor: str = ""
    action: str = ""
    # Days (YYYY-MM-DD, UTC), both included; empty: unbounded.
    start: str = ""
    end: str = ""

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> AuditFilters:
        got = cls(**{f.name: query.get(f.name, "").strip()[:200] for f in fields(cls)})
        got.window()  # refuses a malformed or backwards range now
        return got

    def window(self) -> tuple[dt.datetime | None, dt.datetime | None]:
        """The range as [since, until) instants."""
        return day_window(self.start, self.end)

    def query(self, **changes: str) -> str:
        values = {**asdict(self), **changes}
        return urllib.parse.urlencode({k: v for k, v in values.items() if v})


def subject_href(subject_type: str, subject_id: str) -> str:
    """The console page of an event's subject, or empty when it has none."""
    page = SUBJECT_PAGES.get(subject_type)
    return page + urllib.parse.quote(subject_id) if page and subject_id else ""


def export_csv(entries: Sequence[AuditEntry]) -> str:
    names = [f.name for f in fields(AuditEntry)]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(names)
    for e in entries:
        writer.writerow([csv_cell(getattr(e, n)) for n in names])
    return out.getvalue()


def export_json(entries: Sequence[AuditEntry]) -> str:
    return json.dumps([{**asdict(e), "details": json.loads(e.details)} for e in entries], indent=1)
