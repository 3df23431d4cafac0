"""The fleet at a glance (FleetService.GetFleetHealth), from the router's last fleet sample
(router/fleet/gauges.py), so the overview costs the same for ten collectors or ten thousand: no
query runs per call. Pure: a :class:`FleetSample` and the time in, the answer out."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Mapping

from google.protobuf.timestamp_pb2 import Timestamp
from versus.fleet.v1 import fleet_pb2 as pb

from router.fleet.gauges import BUCKET_S, FleetSample

HOUR_BUCKETS = 12  # of BUCKET_S (5 minutes)
DAY_BUCKETS = 24  # of an hour
# Which settled state counts as which outcome on the overview's charts.
OUTCOME = {"success": "succeeded", "failed": "failed", "expired": "failed", "cancelled": "other",
           "indeterminate": "other"}  # fmt: skip


def _ts(unix: float) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(dt.datetime.fromtimestamp(unix, dt.UTC))
    return out


def _counts(counter: Mapping[str, int]) -> list[pb.NamedCount]:
    return [pb.NamedCount(name=name, count=n) for name, n in sorted(counter.items())]


def buckets(
    outcomes: Mapping[tuple[int, str], int], now: float, width: int, count: int
) -> list[pb.OutcomeBucket]:
    """``count`` buckets of ``width`` seconds ending with the one ``now`` falls in, oldest first."""
    last = int(now // width) * width
    starts = [last - width * i for i in range(count - 1, -1, -1)]
    summed: dict[int, Counter[str]] = {start: Counter() for start in starts}
    for (start, state), n in outcomes.items():
        key = start // width * width
        if key in summed and state in OUTCOME:
            summed[key][OUTCOME[state]] += n
    return [
        pb.OutcomeBucket(start=_ts(s), succeeded=c["succeeded"], failed=c["failed"], other=c["other"])
        for s, c in summed.items()
    ]


def health_pb(sample: FleetSample, now: float) -> pb.GetFleetHealthResponse:
    """The overview's answer from ``sample``, its outcome buckets ending at ``now``."""
    statuses: dict[str, Counter[str]] = defaultdict(Counter)
    sessions: dict[str, Counter[str]] = defaultdict(Counter)
    versions: Counter[str] = Counter()
    for (site, status, session, version), n in sample.collectors.items():
        statuses[site][status] += n
        if status == "active":
            sessions[site][session] += n
            versions[version] += n
    queued: Counter[str] = Counter()
    oldest: dict[str, float] = {}
    for (site, _provider), (n, age) in sample.queue.items():
        queued[site] += n
        oldest[site] = max(oldest.get(site, 0.0), age)
    sites = sorted(set(statuses) | set(queued) | set(sample.indeterminate))
    badges: Counter[str] = Counter()
    for (_site, badge), n in sample.rollout.items():
        badges[badge] += n
    out = pb.GetFleetHealthResponse(
        sampled_at=_ts(sample.sampled_at),
        sites=[
            pb.SiteHealth(
                site_id=site, statuses=_counts(statuses[site]), sessions=_counts(sessions[site]),
                queued=queued[site], oldest_queued_s=oldest.get(site, 0.0),
                indeterminate=sample.indeterminate.get(site, 0),
            )
            for site in sites
        ],
        last_hour=buckets(sample.outcomes, now, BUCKET_S, HOUR_BUCKETS),
        last_day=buckets(sample.outcomes, now, 3600, DAY_BUCKETS),
        expiring=[
            pb.ExpiringCertificate(collector_id=c, site_id=site, not_after=_ts(at))
            for c, site, at in sample.expiring
        ],
        expiring_count=sample.expiring_count,
        versions=_counts(versions),
        update_badges=_counts(badges),
    )  # fmt: skip
    p50, p95 = sample.queue_wait
    if not math.isnan(p50):
        out.queue_wait_p50_s = p50
    if not math.isnan(p95):
        out.queue_wait_p95_s = p95
    return out
