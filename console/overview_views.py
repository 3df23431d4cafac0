"""The fleet overview (the console's landing page) as plain values: site rows, headline numbers, and
the outcome charts drawn as SVG bars on the server (no script, nothing the CSP must allow).
Pure: the FleetService answer and the site names in, the view out."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from versus.fleet.v1 import fleet_pb2 as pb

from console.views import timestamp

CHART_W, CHART_H = 480, 120
SITES_SHOWN = 50
# Bar colours by outcome: the same hues as the task badges, and a legend says which is which.
SERIES = (("succeeded", "#1d6b32"), ("failed", "#a11212"), ("other", "#7a5a00"))


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    # (y, height, colour, outcome) from the bottom up
    parts: list[tuple[float, float, str, str]]
    label: str
    total: int


@dataclass(frozen=True)
class Chart:
    title: str
    bars: list[Bar]
    peak: int
    totals: dict[str, int]
    width: int = CHART_W
    height: int = CHART_H

    @property
    def summary(self) -> str:
        """The chart in words (its accessible name)."""
        said = ", ".join(f"{n} {name}" for name, n in self.totals.items())
        return f"{self.title}: {said}"


@dataclass(frozen=True)
class SiteRow:
    site_id: str
    name: str
    collectors: int
    active: int
    sessions: dict[str, int]
    troubled: int
    queued: int
    oldest_queued: str
    indeterminate: int


@dataclass(frozen=True)
class Overview:
    sampled_at: str
    collectors: int
    active: int
    pending: int
    troubled: int
    queued: int
    oldest_queued: str
    indeterminate: int
    queue_wait: str
    hour: Chart
    day: Chart
    sites: list[SiteRow]
    site_count: int
    expiring: list[tuple[str, str, str, str]]  # (collector, site id, site name, expiry)
    expiring_count: int
    versions: list[tuple[str, int]]
    badges: dict[str, int] = field(default_factory=dict)


def age(seconds: float) -> str:
    """A duration the way the overview says it: "45 s", "12 min", "3 h 5 min"."""
    s = int(seconds)
    if s <= 0:
        return "—"
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def chart(title: str, buckets: list[pb.OutcomeBucket], label_format: str) -> Chart:
    """Stacked bars, one per bucket, scaled to the busiest bucket."""
    peak = max((b.succeeded + b.failed + b.other for b in buckets), default=0)
    slot = CHART_W / max(len(buckets), 1)
    bars = []
    totals = {name: 0 for name, _ in SERIES}
    for i, b in enumerate(buckets):
        y = float(CHART_H)
        parts = []
        for name, colour in SERIES:
            n = int(getattr(b, name))
            totals[name] += n
            h = CHART_H * n / peak if peak else 0.0
            y -= h
            if n:
                parts.append((round(y, 1), round(h, 1), colour, name))
        start = b.start.ToDatetime(dt.UTC)
        bars.append(Bar(round(i * slot + 1, 1), round(slot - 2, 1), parts, start.strftime(label_format),
                        b.succeeded + b.failed + b.other))  # fmt: skip
    return Chart(title, bars, peak, totals)


def overview(got: pb.GetFleetHealthResponse, names: Mapping[str, str]) -> Overview:
    rows = []
    for s in got.sites:
        statuses = {c.name: c.count for c in s.statuses}
        sessions = {c.name: c.count for c in s.sessions}
        troubled = sessions.get("stale", 0) + sessions.get("dead", 0)
        row = SiteRow(
            site_id=s.site_id, name=names.get(s.site_id, ""), collectors=sum(statuses.values()),
            active=statuses.get("active", 0), sessions=sessions, troubled=troubled, queued=s.queued,
            oldest_queued=age(s.oldest_queued_s), indeterminate=s.indeterminate,
        )  # fmt: skip
        rows.append(row)
    # The sites that need a look first: troubled collectors, work waiting for an operator, queues.
    rows.sort(key=lambda r: (-r.troubled, -r.indeterminate, -r.queued, r.name or r.site_id))
    oldest = max((s.oldest_queued_s for s in got.sites), default=0.0)
    wait = (
        f"{got.queue_wait_p50_s:.1f} s median, {got.queue_wait_p95_s:.1f} s at the 95th percentile"
        if got.HasField("queue_wait_p50_s") and got.HasField("queue_wait_p95_s")
        else "no task handed out in the last hour"
    )
    return Overview(
        sampled_at=timestamp(got.sampled_at),
        collectors=sum(r.collectors for r in rows), active=sum(r.active for r in rows),
        pending=sum({c.name: c.count for c in s.statuses}.get("pending", 0) for s in got.sites),
        troubled=sum(r.troubled for r in rows), queued=sum(r.queued for r in rows), oldest_queued=age(oldest),
        indeterminate=sum(r.indeterminate for r in rows), queue_wait=wait,
        hour=chart("Tasks settled in the last hour, per 5 minutes", list(got.last_hour), "%H:%M"),
        day=chart("Tasks settled in the last day, per hour", list(got.last_day), "%H:00"),
        sites=rows[:SITES_SHOWN], site_count=len(rows),
        expiring=[
            (e.collector_id, e.site_id, names.get(e.site_id, ""), timestamp(e.not_after))
            for e in got.expiring
        ],
        expiring_count=got.expiring_count,
        versions=sorted(((c.name, c.count) for c in got.versions), key=lambda v: -v[1]),
        badges={c.name: c.count for c in got.update_badges},
    )  # fmt: skip
