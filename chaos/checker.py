"""The promises, checked after a chaos run against PostgreSQL, Redis, the devices and the logs.

1. Every accepted task is terminal (success, failed, expired, cancelled) or waits for an
   operator (indeterminate) once its deadline and a sweep have passed.
2. A mutation is applied at most once per idempotency key; a successful one exactly once; an
   expired or cancelled one never.
3. A refused submission left no task behind.
4. No two mutating dispatches of one device were out at the same time (router bookkeeping).
5. Redis in-flight counters equal PostgreSQL's count of leased, dispatched and running work.
6. No 5xx answer (gateway) and no failed call (platform) outside a fault window, and no internal
   error (500 / INTERNAL) at all.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import psycopg
from redis import Redis

from chaos.faults import Window
from chaos.workload import TERMINAL, Submitted

MUTATIONS = {"append", "apply_once"}


def applications(devices: Path) -> Counter[str]:
    """How many times each idempotency key was applied, over every device file."""
    counts: Counter[str] = Counter()
    for device in devices.iterdir():
        counts.update(line for line in device.read_text().splitlines() if line)
    return counts


def check_tasks(tasks: Iterable[Submitted], applied: Counter[str], states: dict[str, str]) -> list[str]:
    """``states``: every task in PostgreSQL, idempotency key -> state."""
    problems = []
    for t in tasks:
        if not t.task_id:
            if t.refused and t.key in states:
                problems.append(f"{t.key}: refused ({t.refused}) but a task exists")
            if t.refused or t.key not in states:
                continue
            # Every attempt failed, yet one was committed: it counts as accepted.
            t.state = states[t.key]
        if t.state not in TERMINAL:
            problems.append(f"{t.key} ({t.operation} on {t.target}): still {t.state or 'unknown'}")
        if t.operation not in MUTATIONS:
            continue
        n = applied.get(t.key, 0)
        if n > 1:
            problems.append(f"{t.key} ({t.operation}): applied {n} times")
        if t.state == "success" and n != 1:
            problems.append(f"{t.key} ({t.operation}): success but applied {n} times")
        if t.state in ("expired", "cancelled") and n:
            problems.append(f"{t.key} ({t.operation}): {t.state} but applied")
    return problems


def overlaps(dispatches: Sequence[tuple[str, str, dt.datetime, dt.datetime | None]]) -> list[str]:
    """(target, dispatch id, handed out at, ended at) of mutating dispatches -> overlapping pairs."""
    by_target: dict[str, list[tuple[dt.datetime, dt.datetime | None, str]]] = defaultdict(list)
    for target, dispatch_id, handed, ended in dispatches:
        by_target[target].append((handed, ended, dispatch_id))
    problems = []
    for target, spans in by_target.items():
        spans.sort()
        for (_, first_end, first), (second_start, _, second) in itertools.pairwise(spans):
            if first_end is None or second_start < first_end:
                problems.append(f"{target}: {second} handed out while {first} was still out")
    return problems


def database_facts(
    url: str,
) -> tuple[dict[str, str], list[tuple[str, str, dt.datetime, dt.datetime | None]], Counter[tuple[str, str]]]:
    """Task states by idempotency key, mutating dispatches' spans, in-flight counts per collector/provider."""
    with psycopg.connect(url) as conn:
        keys = {str(row[0]): str(row[1]) for row in conn.execute("SELECT idempotency_key, state FROM tasks")}
        spans = conn.execute(
            """
            SELECT target_ref, dispatch_id, handed_at,
                   CASE WHEN state IN ('dispatched', 'running') THEN NULL
                        ELSE coalesce(reported_at, updated_at) END
            FROM dispatches
            WHERE kind = 'execute' AND op_class <> 'read' AND handed_at IS NOT NULL
            """
        ).fetchall()
        in_flight = Counter(
            {
                (row[0], row[1]): int(row[2])
                for row in conn.execute(
                    "SELECT collector_id, provider, count(*) FROM dispatches"
                    " WHERE state IN ('leased', 'dispatched', 'running') GROUP BY 1, 2"
                )
            }
        )
    return keys, spans, in_flight


def check_counters(client: Redis, truth: Counter[tuple[str, str]]) -> list[str]:
    seen: Counter[tuple[str, str]] = Counter()
    for key in client.scan_iter(match="versus:inflight:*"):
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name == "versus:inflight:built":
            continue
        collector = name.removeprefix("versus:inflight:")
        for provider, value in client.hgetall(key).items():
            if int(value):
                seen[(collector, provider.decode() if isinstance(provider, bytes) else provider)] = int(value)
    return [
        f"in-flight {key[0]}/{key[1]}: Redis {seen[key]}, PostgreSQL {truth[key]}"
        for key in sorted(set(seen) | set(truth))
        if seen[key] != truth[key]
    ]


def server_errors(gateway_log: Path, started_wall: float, started_mono: float) -> list[tuple[float, str]]:
    """(monotonic time, line) of every 5xx the gateway answered, from its JSON access log."""
    out = []
    for line in gateway_log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or int(record.get("status", 0) or 0) < 500:
            continue
        at = dt.datetime.fromisoformat(str(record.get("timestamp", "")).replace("Z", "+00:00")).timestamp()
        out.append(
            (
                started_mono + (at - started_wall),
                f"{record.get('method')} {record.get('path')} {record['status']}",
            )
        )
    return out


def outside_windows(
    errors: Iterable[tuple[float, str]], windows: Sequence[Window], origin: float
) -> list[str]:
    """Errors (monotonic time, what) that no fault window covers, timed from ``origin``; an internal
    error (500, INTERNAL) counts anywhere: a fault should make things unavailable, never broken."""
    return [
        f"{what} at +{at - origin:.1f}s "
        + ("(internal error)" if _internal(what) else "outside any fault window")
        for at, what in errors
        if _internal(what) or not any(w.covers(at) for w in windows)
    ]


def _internal(what: str) -> bool:
    return what.endswith(" 500") or "INTERNAL" in what
