"""The failover drill's faults (issue 42): the data tier of deploy/ losing its parts under load.

The stack runs on a Patroni cluster (tests/support/data_tier.py: two PostgreSQL nodes, three etcd
members, synchronous replication) and a Redis Sentinel group instead of the embedded servers.
Each fault returns a one-line detail with what it measured; what the services must do meanwhile
(readiness false while PostgreSQL takes no writes, true again after, no restart) is checked here
and reported as a problem, the data itself by the chaos checker like any other fault.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import psycopg

from chaos.stack import ChaosStack, serving
from common.db.urls import libpq_url

# The drill's faults, in the order the issue names them: each lands after the previous one has
# healed, so every one is measured on a whole cluster.
DRILL = ("postgres_primary_kill", "etcd_member_loss", "redis_failover")
# What a write may wait while a primary is replaced (issue 42's target).
WRITE_WINDOW_S = 30.0
# How long an etcd member stays down.
MEMBER_DOWN_S = 8.0


@dataclass
class Findings:
    """What the drill measured (printed) and what it found wrong (violations)."""

    measures: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def writable(url: str) -> bool:
    """A new connection from the services' URL gets a transaction id: writes are possible."""
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=2) as conn:
            conn.execute("SELECT pg_catalog.txid_current()")
        return True
    except psycopg.Error:
        return False


def _grpc_ports(stack: ChaosStack) -> dict[str, str]:
    return {name: stack.env[f"VERSUS_{name.upper()}_PORT"] for name in ("router", "enrollment")}


def primary_kill(stack: ChaosStack, findings: Findings) -> str:
    """SIGKILL the node running the primary (Patroni and PostgreSQL); measure until a write commits
    again and until every service is ready again; bring the node back as a standby."""
    tier = stack.tier
    deadline = time.monotonic() + 90
    while not tier.replicated():  # a previous kill's node has rejoined: a synchronous standby exists
        if time.monotonic() > deadline:
            raise RuntimeError(f"no synchronous standby to fail over to: {tier.cluster()}")
        time.sleep(0.5)
    old, standby = tier.leader(), tier.sync_standby()
    tier.kill_node(old)
    killed = time.monotonic()
    not_ready: set[str] = set()
    while not writable(tier.url):
        not_ready |= {name for name, port in _grpc_ports(stack).items() if not serving(port)}
        if time.monotonic() - killed > 120:
            raise RuntimeError(f"no writable primary 120 s after killing {old}: {tier.cluster()}")
        time.sleep(0.2)
    window = time.monotonic() - killed
    stack.wait_ready(90)
    ready = time.monotonic() - killed
    new = tier.leader()
    tier.start_node(old)  # rejoins as a standby of the new primary (pg_rewind) in the background
    findings.measures.append(
        f"PostgreSQL primary {old} SIGKILL: {new} promoted, writes again after {window:.1f} s, "
        f"every service ready after {ready:.1f} s"
    )
    if window > WRITE_WINDOW_S:
        findings.problems.append(f"write-unavailability window {window:.1f} s > {WRITE_WINDOW_S:.0f} s")
    if new != standby:
        findings.problems.append(f"{new} was promoted, not the synchronous standby {standby}")
    missing = set(_grpc_ports(stack)) - not_ready
    if missing:
        findings.problems.append(
            f"{', '.join(sorted(missing))} stayed SERVING while PostgreSQL took no writes ({window:.1f} s)"
        )
    return f"{old} SIGKILL, {new} promoted after {window:.1f} s"


def etcd_member_loss(stack: ChaosStack, findings: Findings, rng: random.Random) -> str:
    """SIGKILL one etcd member of three; the primary must keep its leader key (a quorum is left)
    and writes must go on; the member then rejoins."""
    tier = stack.tier
    leader = tier.leader()
    victim = rng.choice(sorted(tier.etcd))
    tier.kill_member(victim)
    ends = time.monotonic() + MEMBER_DOWN_S
    refused = 0
    while time.monotonic() < ends:
        refused += not writable(tier.url)
        time.sleep(0.25)
    tier.start_member(victim)
    after = tier.leader()
    findings.measures.append(
        f"etcd member {victim} lost for {MEMBER_DOWN_S:.0f} s: primary {after}, "
        f"{refused} write probes refused"
    )
    if after != leader or refused:
        findings.problems.append(
            f"losing etcd member {victim} disturbed PostgreSQL: leader {leader} -> {after}, "
            f"{refused} write probes refused"
        )
    return f"{victim} SIGKILL for {MEMBER_DOWN_S:.0f} s"


def redis_failover(stack: ChaosStack, findings: Findings) -> str:
    """SIGKILL the Redis master; Sentinel promotes the replica; the old master comes back as a
    replica of the new one (ready for another failover)."""
    group = stack.sentinels
    started = time.monotonic()
    old = group.kill_master()
    new = group.wait_failover(old)
    promoted = time.monotonic() - started
    group.revive(old)
    stack.wait_ready(60)
    findings.measures.append(
        f"Redis master :{old} SIGKILL: :{new} promoted after {promoted:.1f} s, "
        f"every service ready after {time.monotonic() - started:.1f} s"
    )
    return f":{old} SIGKILL, :{new} promoted after {promoted:.1f} s"
