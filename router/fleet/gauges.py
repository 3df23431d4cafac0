"""The fleet as gauges an operator alerts on (docs/operations.md, "Metrics"), sampled by the router.

Every router process samples the same fleet-wide numbers from PostgreSQL and Redis every
:data:`SAMPLE_INTERVAL_S`: aggregate them across routers with ``max``, never ``sum``
(deploy/prometheus/ does). A sample is counted here from plain rows (:func:`summarize`, pure) and
published as one snapshot that a scrape reads whole, so no scrape sees half of one sample and half
of the next, and a site whose last queued task left drops out of the next scrape.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector
from sqlalchemy import RowMapping, text

from common.db.schema import collector_capabilities, collector_updates, collectors, sites
from common.trust.keys import KeySet
from router.core.fleet_state import collector_status, session_state
from router.fleet import store as fleet_store
from router.releases import store as release_store
from router.releases import update_policy
from router.releases.updates import collector_facts, release_facts

SAMPLE_INTERVAL_S = 15.0
# The outcome histogram's bucket, and how far ahead a certificate expiry is worth an operator's notice.
BUCKET_S = 300
EXPIRING_WITHIN_S = 14 * 86400
EXPIRING_LISTED = 50

_COLUMNS = (
    collectors.c.collector_id, collectors.c.site_id, collectors.c.status, collectors.c.cert_not_after,
    collectors.c.agent_version, collectors.c.os, collectors.c.arch,
    collector_capabilities.c.agent_version.label("running_version"), collector_capabilities.c.draining,
    sites.c.update_policy, sites.c.update_channel, sites.c.pinned_version,
    collector_updates.c.approved_version, collector_updates.c.target_version,
    collector_updates.c.state.label("update_state"),
    collector_updates.c.state_version.label("update_state_version"),
)  # fmt: skip

# Queued and indeterminate tasks by site and provider, with the oldest's age, in one statement.
_WAITING = text(
    """
    SELECT state, site_id, provider, count(*) AS n, extract(epoch FROM now() - min(created_at)) AS oldest_s
    FROM tasks WHERE state IN ('queued', 'indeterminate') GROUP BY state, site_id, provider
    """
)
_LEASES = text("SELECT count(*) FROM device_leases WHERE holder_task_id IS NOT NULL")
# Settled tasks of the last day by outcome and 5-minute bucket (ix_tasks_updated_at).
_OUTCOMES = text(
    """
    SELECT state, (floor(extract(epoch FROM updated_at) / :bucket) * :bucket)::bigint AS bucket,
           count(*) AS n
    FROM tasks
    WHERE state IN ('success', 'failed', 'expired', 'cancelled', 'indeterminate')
      AND updated_at > now() - interval '24 hours'
    GROUP BY 1, 2
    """
)
# How long the last hour's tasks waited for their first hand-out (ix_tasks_created_at_task_id).
_QUEUE_WAIT = text(
    """
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY w), percentile_cont(0.95) WITHIN GROUP (ORDER BY w)
    FROM (
        SELECT extract(epoch FROM d.created_at - t.created_at) AS w
        FROM tasks t JOIN dispatches d ON d.task_id = t.task_id AND d.attempt = 1
        WHERE t.created_at > now() - interval '1 hour'
    ) waits
    """
)


@dataclass(frozen=True, slots=True)
class FleetSample:
    """One sample of everything this module exports."""

    # (site, status, session, version) -> collectors
    collectors: Mapping[tuple[str, str, str, str], int] = field(default_factory=dict)
    # (site, badge) -> collectors, active ones with a known version
    rollout: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # (site, provider) -> (queued tasks, the oldest's age in seconds)
    queue: Mapping[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    # site -> tasks waiting for an operator
    indeterminate: Mapping[str, int] = field(default_factory=dict)
    device_leases: int = 0
    # The soonest certificate expiry of a pending or active collector (Unix time; NaN: none).
    cert_soonest: float = math.nan
    # set -> (version, live keys, the current key's expiry as Unix time)
    key_sets: Mapping[str, tuple[int, int, float]] = field(default_factory=dict)
    sampled_at: float = 0.0
    # Pending or active collectors whose certificate expires within EXPIRING_WITHIN_S, soonest
    # first, at most EXPIRING_LISTED: (collector, site, expiry as Unix time); and how many in all.
    expiring: tuple[tuple[str, str, float], ...] = ()
    expiring_count: int = 0
    # (bucket start as Unix time, outcome state) -> settled tasks, over the last day
    outcomes: Mapping[tuple[int, str], int] = field(default_factory=dict)
    # The last hour's wait from submit to first hand-out: median and 95th percentile (NaN: none).
    queue_wait: tuple[float, float] = (math.nan, math.nan)


def summarize(
    rows: Iterable[Mapping[str, Any]] | Iterable[RowMapping],
    last_seen: Mapping[str, float],
    releases: Sequence[Mapping[str, Any]] | Sequence[RowMapping],
    waiting: Iterable[Mapping[str, Any]] | Iterable[RowMapping],
    now: float,
) -> FleetSample:
    """Count a sample from the collectors' rows (fleet_store columns above), their last claims (Unix
    time, Redis), the live releases and the waiting-task groups."""
    wall = dt.datetime.fromtimestamp(now, dt.UTC)
    fleet: Counter[tuple[str, str, str, str]] = Counter()
    rollout: Counter[tuple[str, str]] = Counter()
    soonest = math.inf
    expiring: list[tuple[str, str, float]] = []
    for row in rows:
        status = collector_status(row["status"], row["cert_not_after"], wall).value
        seen = last_seen.get(row["collector_id"])
        session = session_state(seen, bool(row["draining"]), now).value
        running = row["running_version"] or row["agent_version"] or ""
        fleet[(row["site_id"], status, session, running or "unknown")] += 1
        if row["status"] in ("pending", "active"):
            expiry = row["cert_not_after"].timestamp()
            soonest = min(soonest, expiry)
            if now < expiry <= now + EXPIRING_WITHIN_S:
                expiring.append((row["collector_id"], row["site_id"], expiry))
        if row["status"] == "active" and running:
            rollout[(row["site_id"], _badge(row, running, releases))] += 1
    queue: dict[tuple[str, str], tuple[int, float]] = {}
    indeterminate: Counter[str] = Counter()
    for group in waiting:
        if group["state"] == "queued":
            queue[(group["site_id"], group["provider"])] = (
                int(group["n"]),
                max(float(group["oldest_s"]), 0.0),
            )
        else:
            indeterminate[group["site_id"]] += int(group["n"])
    expiring.sort(key=lambda e: e[2])
    return FleetSample(
        collectors=dict(fleet), rollout=dict(rollout), queue=queue, indeterminate=dict(indeterminate),
        cert_soonest=soonest if soonest != math.inf else math.nan, sampled_at=now,
        expiring=tuple(expiring[:EXPIRING_LISTED]), expiring_count=len(expiring),
    )  # fmt: skip


def _badge(
    row: Mapping[str, Any] | RowMapping,
    running: str,
    releases: Sequence[Mapping[str, Any]] | Sequence[RowMapping],
) -> str:
    said = {"running": running, "state": row["update_state"], "state_version": row["update_state_version"]}
    facts = collector_facts({**row, **said})
    newest = update_policy.latest(release_facts(releases, row["os"], row["arch"]), facts.channel)
    badge = update_policy.badge(facts, newest.version if newest else None, row["target_version"] or None)
    return badge.value or "unknown"


def key_set_facts(sets: Mapping[str, KeySet], now: int) -> dict[str, tuple[int, int, float]]:
    """Per key set: its version, how many keys verify now (two during a rotation), and when the
    current signing key expires."""
    return {
        name: (ks.version, len(ks.public_keys(now)), float(ks.current.not_after)) for name, ks in sets.items()
    }


class FleetGauges(Collector):
    """The latest :class:`FleetSample` as Prometheus gauges (registered once per process)."""

    def __init__(self) -> None:
        self.sample = FleetSample()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.sample  # one snapshot for the whole scrape
        yield _family(
            "versus_collectors", "Collectors by site, status (pending, active, expired, denied, revoked), "
            "session (active, stale, draining, dead) and running version.",
            ["site", "status", "session", "version"], s.collectors,
        )  # fmt: skip
        yield _family(
            "versus_collector_updates", "Active collectors by site and update badge (up_to_date, "
            "update_available, updating, failed, rolled_back).", ["site", "badge"], s.rollout,
        )  # fmt: skip
        yield _family(
            "versus_router_queue_depth", "Tasks queued (no collector took them yet), by site and provider.",
            ["site", "provider"], {k: v[0] for k, v in s.queue.items()},
        )  # fmt: skip
        yield _family(
            "versus_router_queue_oldest_age_seconds", "Age of the oldest queued task, by site and provider.",
            ["site", "provider"], {k: v[1] for k, v in s.queue.items()},
        )  # fmt: skip
        yield _family(
            "versus_router_indeterminate_tasks", "Tasks waiting for an operator's decision, by site.",
            ["site"], {(k,): v for k, v in s.indeterminate.items()},
        )  # fmt: skip
        yield _family(
            "versus_router_device_leases", "Devices leased to a mutation now.", [], {(): s.device_leases}
        )
        yield _family(
            "versus_collector_cert_soonest_expiry_timestamp_seconds",
            "When the first pending or active collector certificate expires (Unix time; NaN: none).",
            [], {(): s.cert_soonest},
        )  # fmt: skip
        yield _family(
            "versus_key_set_version", "The version of each signing key set (dispatch, release).",
            ["set"], {(k,): v[0] for k, v in s.key_sets.items()},
        )  # fmt: skip
        yield _family(
            "versus_key_set_keys", "Keys that verify now, per set: 2 while a rotation overlaps.",
            ["set"], {(k,): v[1] for k, v in s.key_sets.items()},
        )  # fmt: skip
        yield _family(
            "versus_key_set_current_expiry_timestamp_seconds",
            "When each set's signing key expires (Unix time).",
            ["set"], {(k,): v[2] for k, v in s.key_sets.items()},
        )  # fmt: skip
        yield _family(
            "versus_fleet_sampled_timestamp_seconds",
            "When these fleet gauges were last sampled (Unix time).",
            [], {(): s.sampled_at},
        )  # fmt: skip


def _family(name: str, doc: str, labels: list[str], values: Mapping[Any, float | int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in values.items():
        family.add_metric([str(k) for k in (key if isinstance(key, tuple) else (key,))], float(value))
    return family


GAUGES = FleetGauges()
REGISTRY.register(GAUGES)


async def sample(engine: Any, live: Any, key_sets: Mapping[str, KeySet]) -> FleetSample:
    """Read a sample (PostgreSQL: collectors, releases, waiting tasks, leases; Redis: last claims)
    and publish it."""
    now = time.time()
    async with engine.connect() as conn:
        rows = await fleet_store.list_collectors(
            conn, query="", site_id="", after="", limit=0, columns=_COLUMNS
        )
        releases = await release_store.live_releases(conn)
        waiting = (await conn.execute(_WAITING)).mappings().all()
        leases = int((await conn.execute(_LEASES)).scalar_one())
        outcomes = {
            (int(r.bucket), str(r.state)): int(r.n)
            for r in (await conn.execute(_OUTCOMES, {"bucket": BUCKET_S})).all()
        }
        p50, p95 = (await conn.execute(_QUEUE_WAIT)).one()
    last_seen = await live.all_last_seen()
    counted = summarize(rows, last_seen, releases, waiting, now)
    GAUGES.sample = replace(
        counted, device_leases=leases, key_sets=key_set_facts(key_sets, int(now)), outcomes=outcomes,
        queue_wait=(_number(p50), _number(p95)),
    )  # fmt: skip
    return GAUGES.sample


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)
