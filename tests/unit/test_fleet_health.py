"""The fleet overview's answer, from a fleet sample fed in: per-site counts, outcome buckets, the
expiring certificates, versions and the queue wait."""

from __future__ import annotations

import datetime as dt
import math

from router.fleet.gauges import BUCKET_S, FleetSample
from router.fleet.health import buckets, health_pb

NOW = dt.datetime(2026, 12, 6, 12, 7, 30, tzinfo=dt.UTC).timestamp()
BUCKET = int(NOW // BUCKET_S) * BUCKET_S  # 12:05


def test_outcomes_land_in_their_buckets_oldest_first_and_old_ones_drop_out() -> None:
    outcomes = {
        (BUCKET, "success"): 5, (BUCKET, "failed"): 1, (BUCKET, "expired"): 2,
        (BUCKET - BUCKET_S, "cancelled"): 3, (BUCKET - BUCKET_S, "indeterminate"): 1,
        (BUCKET - 11 * BUCKET_S, "success"): 7,  # the first of the hour's twelve
        (BUCKET - 12 * BUCKET_S, "success"): 100,  # an hour ago: on the day chart only
        (BUCKET, "queued"): 9,  # not settled: never counted
    }  # fmt: skip
    hour = buckets(outcomes, NOW, BUCKET_S, 12)
    assert len(hour) == 12
    assert [b.start.ToDatetime(dt.UTC).strftime("%H:%M") for b in (hour[0], hour[-1])] == ["11:10", "12:05"]
    assert (hour[-1].succeeded, hour[-1].failed, hour[-1].other) == (5, 3, 0)
    assert (hour[-2].succeeded, hour[-2].failed, hour[-2].other) == (0, 0, 4)
    assert hour[0].succeeded == 7
    assert sum(b.succeeded for b in hour) == 12
    day = buckets(outcomes, NOW, 3600, 24)
    assert len(day) == 24 and day[-1].start.ToDatetime(dt.UTC).hour == 12
    assert (day[-1].succeeded, day[-2].succeeded) == (5, 107)  # 12:00-12:59 and 11:00-11:59


def test_the_overview_counts_sites_sessions_queues_and_versions() -> None:
    sample = FleetSample(
        collectors={
            ("site-a", "active", "active", "1.4.0"): 3, ("site-a", "active", "dead", "1.3.0"): 1,
            ("site-a", "revoked", "offline", "1.3.0"): 2, ("site-b", "pending", "offline", "unknown"): 1,
        },
        rollout={("site-a", "up_to_date"): 3, ("site-a", "update_available"): 1},
        queue={("site-a", "stub"): (4, 30.0), ("site-a", "ssh"): (1, 90.0), ("site-c", "stub"): (2, 5.0)},
        indeterminate={"site-b": 1},
        sampled_at=NOW - 3,
        expiring=(("col-1", "site-a", NOW + 86400.0),),
        expiring_count=7,
        queue_wait=(0.4, 2.5),
    )  # fmt: skip
    got = health_pb(sample, NOW)
    sites = {s.site_id: s for s in got.sites}
    assert sorted(sites) == ["site-a", "site-b", "site-c"]
    a = sites["site-a"]
    assert {c.name: c.count for c in a.statuses} == {"active": 4, "revoked": 2}
    assert {c.name: c.count for c in a.sessions} == {"active": 3, "dead": 1}  # active collectors only
    assert (a.queued, a.oldest_queued_s, a.indeterminate) == (5, 90.0, 0)
    assert (sites["site-c"].queued, sites["site-b"].indeterminate) == (2, 1)
    assert {c.name: c.count for c in got.versions} == {"1.4.0": 3, "1.3.0": 1}
    assert {c.name: c.count for c in got.update_badges} == {"up_to_date": 3, "update_available": 1}
    assert [e.collector_id for e in got.expiring] == ["col-1"] and got.expiring_count == 7
    assert (got.queue_wait_p50_s, got.queue_wait_p95_s) == (0.4, 2.5)


def test_no_wait_measured_is_absent_not_zero() -> None:
    got = health_pb(FleetSample(sampled_at=NOW, queue_wait=(math.nan, math.nan)), NOW)
    assert not got.HasField("queue_wait_p50_s") and not got.HasField("queue_wait_p95_s")
    assert not got.sites and len(got.last_day) == 24
