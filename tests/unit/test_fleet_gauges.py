"""The fleet gauges counted from plain rows (router/fleet/gauges.py summarize), and exported whole."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from common.trust.keys import KeyPurpose, KeySet
from router.fleet import gauges
from router.fleet.gauges import FleetGauges, FleetSample, key_set_facts, summarize

NOW = 1_800_000_000.0
WALL = dt.datetime.fromtimestamp(NOW, dt.UTC)


def _row(
    cid: str, site: str = "berlin", status: str = "active", running: str = "1.4.0", **more: object
) -> dict[str, Any]:
    row = {
        "collector_id": cid, "site_id": site, "status": status, "agent_version": "1.0.0",
        "cert_not_after": WALL + dt.timedelta(days=80), "os": "linux", "arch": "x86_64",
        "running_version": running, "draining": False, "update_policy": "manual", "update_channel": "stable",
        "pinned_version": None, "approved_version": None, "target_version": None, "update_state": None,
        "update_state_version": None,
    }  # fmt: skip
    row.update(more)
    return row


def _release(version: str) -> dict[str, Any]:
    return {"version": version, "channel": "stable", "security_fix": False, "published_at": WALL,
            "os": "linux", "arch": "x86_64"}  # fmt: skip


def test_collectors_are_counted_by_site_status_session_and_version() -> None:
    rows = [
        _row("a"), _row("b"), _row("c", running=""),  # never said: its enrolled version, 1.0.0
        _row("d", site="lyon", status="pending"),
        _row("e", cert_not_after=WALL - dt.timedelta(days=1)),  # expired, whatever is stored
        _row("f", draining=True),
    ]  # fmt: skip
    seen = {"a": NOW - 5, "b": NOW - 100, "c": NOW - 500, "f": NOW - 1}  # d and e: never claimed
    sample = summarize(rows, seen, [], [], NOW)
    assert sample.collectors == {
        ("berlin", "active", "active", "1.4.0"): 1,
        ("berlin", "active", "stale", "1.4.0"): 1,
        ("berlin", "active", "dead", "1.0.0"): 1,
        ("lyon", "pending", "dead", "1.4.0"): 1,
        ("berlin", "expired", "dead", "1.4.0"): 1,
        ("berlin", "active", "draining", "1.4.0"): 1,
    }
    # The soonest expiry among pending and active collectors (the expired one counts: it is active).
    assert sample.cert_soonest == (WALL - dt.timedelta(days=1)).timestamp()


def test_rollout_badges_follow_the_update_policy() -> None:
    rows = [
        _row("a", running="1.5.0"),
        _row("b", running="1.4.0"),
        _row("c", running="1.4.0", target_version="1.5.0"),
        _row("d", running="1.4.0", update_state="rolled_back", update_state_version="1.5.0"),
        _row("e", status="revoked"),  # not counted: not active
    ]
    sample = summarize(rows, {}, [_release("1.4.0"), _release("1.5.0")], [], NOW)
    assert sample.rollout == {
        ("berlin", "up_to_date"): 1, ("berlin", "update_available"): 1, ("berlin", "updating"): 1,
        ("berlin", "rolled_back"): 1,
    }  # fmt: skip


def test_waiting_tasks_give_queue_depth_oldest_age_and_the_operator_queue() -> None:
    waiting = [
        {"state": "queued", "site_id": "berlin", "provider": "ssh", "n": 3, "oldest_s": 42.5},
        {"state": "queued", "site_id": "lyon", "provider": "http", "n": 1, "oldest_s": -0.1},  # clocks
        {"state": "indeterminate", "site_id": "lyon", "provider": "ssh", "n": 2, "oldest_s": 9},
        {"state": "indeterminate", "site_id": "lyon", "provider": "http", "n": 1, "oldest_s": 9},
    ]
    sample = summarize([], {}, [], waiting, NOW)
    assert sample.queue == {("berlin", "ssh"): (3, 42.5), ("lyon", "http"): (1, 0.0)}
    assert sample.indeterminate == {"lyon": 3}
    assert math.isnan(sample.cert_soonest)


def test_key_sets_say_their_version_overlap_and_expiry() -> None:
    now = int(NOW)
    dispatch = KeySet.create(KeyPurpose.DISPATCH, now).rotate(now)
    facts = key_set_facts({"dispatch": dispatch}, now)
    assert facts == {"dispatch": (2, 2, float(dispatch.current.not_after))}


def test_a_scrape_reads_one_whole_sample_and_series_that_emptied_are_gone() -> None:
    registry = CollectorRegistry()
    fleet = FleetGauges()
    registry.register(fleet)
    fleet.sample = FleetSample(queue={("berlin", "ssh"): (3, 42.5)}, device_leases=2, sampled_at=NOW)
    text = generate_latest(registry).decode()
    assert 'versus_router_queue_depth{provider="ssh",site="berlin"} 3.0' in text
    assert 'versus_router_queue_oldest_age_seconds{provider="ssh",site="berlin"} 42.5' in text
    assert "versus_router_device_leases 2.0" in text
    fleet.sample = FleetSample(sampled_at=NOW + 15)
    text = generate_latest(registry).decode()
    assert "versus_router_queue_depth{" not in text  # the site's last queued task left
    assert "versus_fleet_sampled_timestamp_seconds 1.800000015e+09" in text
    assert gauges.GAUGES is not fleet  # the process's own instance is registered once, at import
