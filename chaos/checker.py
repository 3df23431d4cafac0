"""The promises, checked after a chaos run against durable evidence: PostgreSQL, the devices'
own files, Redis and the logs - never the runner's memory of what the router answered.

1. Every accepted task is terminal (success, failed, expired, cancelled) or waits for an
   operator (indeterminate), and got there by its deadline plus one sweep (times from
   PostgreSQL's transition records; a fault of the router or PostgreSQL excuses lateness).
2. A mutation is applied at most once per idempotency key; a successful one exactly once; an
   expired, cancelled or failed one never.
3. A refused submission left no task behind; a mutation submitted as a read is refused.
4. One writer per device, from the devices' own evidence: every write carries its dispatch's
   lease epoch and time, epochs never go back, and no write lands after its envelope expired.
   (Also: no two mutating dispatches of one device were out at once in the router's records.)
5. A task fails only after a collector tried it; an operation nobody offers never runs and
   expires; an outcome is indeterminate only if a fault touched its holder (or the device
   would not confirm a one-shot change).
6. Redis in-flight counters equal PostgreSQL's count of leased, dispatched and running work.
7. No 5xx answer (gateway) and no failed call (platform) outside a fault of a server-side
   component plus a few seconds, and no internal error (500 / INTERNAL) at all.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from redis import Redis

from chaos.faults import SERVER_SIDE, Window
from chaos.workload import TERMINAL, Submitted
from collector.drivers.stub import WRITES_SUFFIX

MUTATIONS = {"append", "apply_once"}


def applications(devices: Path) -> Counter[str]:
    """How many times each idempotency key was applied, over every device file."""
    counts: Counter[str] = Counter()
    for device in devices.iterdir():
        if device.name.endswith(WRITES_SUFFIX):
            continue
        counts.update(line for line in device.read_text().splitlines() if line)
    return counts


# How late (past deadline + one sweep) a task may settle without a server-side fault to blame.
SETTLE_SLACK_S = 3.0
SWEEP_S = 5.0


@dataclass(frozen=True, slots=True)
class TaskFact:
    """One task as PostgreSQL records it."""

    state: str
    deadline: dt.datetime
    created_at: dt.datetime
    settled_at: dt.datetime | None  # first transition into a settled state
    error_code: str
    collectors: tuple[str, ...]  # every collector any of its dispatches went to
    handed: int  # execute dispatches handed to a collector
    # Its collector reported stopping it on a cancel after its change began (docs/protocol.md).
    stopped_mid_change: bool = False


def task_facts(url: str) -> dict[str, TaskFact]:
    """Every task in PostgreSQL by idempotency key."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """
            SELECT t.idempotency_key, t.state, t.deadline, t.created_at,
                   (SELECT min(tt.at) FROM task_transitions tt WHERE tt.task_id = t.task_id
                      AND tt.to_state IN ('success', 'failed', 'expired', 'cancelled', 'indeterminate')),
                   coalesce(t.error_code, ''),
                   array(SELECT DISTINCT d.collector_id FROM dispatches d WHERE d.task_id = t.task_id),
                   (SELECT count(*) FROM dispatches d WHERE d.task_id = t.task_id AND d.kind = 'execute'
                      AND d.handed_at IS NOT NULL),
                   EXISTS (SELECT 1 FROM dispatches d WHERE d.task_id = t.task_id
                      AND d.error_code = 'cancelled_mid_change')
            FROM tasks t
            """
        ).fetchall()
    return {
        str(r[0]): TaskFact(str(r[1]), r[2], r[3], r[4], str(r[5]), tuple(r[6]), int(r[7]), bool(r[8]))
        for r in rows
    }


@dataclass(frozen=True, slots=True)
class Clock:
    """Maps the runner's monotonic times to wall-clock times (PostgreSQL's)."""

    wall: float
    mono: float

    def to_wall(self, at: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.wall + (at - self.mono), dt.UTC)

    def to_mono(self, at: dt.datetime) -> float:
        return self.mono + (at.timestamp() - self.wall)


def check_facts(
    tasks: Iterable[Submitted],
    facts: dict[str, TaskFact],
    applied: Counter[str],
    windows: Sequence[Window],
    clock: Clock,
    collector_names: dict[str, str],
) -> list[str]:
    """Promises 1, 2, 3 and 5 from PostgreSQL's records; ``collector_names``: collector id -> process."""
    problems = check_tasks(tasks, applied, {k: f.state for k, f in facts.items()})
    for t in tasks:
        fact = facts.get(t.key)
        if fact is None:
            continue
        label = f"{t.key} ({t.operation} on {t.target})"
        if t.lie:
            problems.append(f"{label}: a mutation submitted as a read was accepted")
        if fact.settled_at is None:
            continue
        window_s = (fact.settled_at - fact.deadline).total_seconds()
        late = window_s > SWEEP_S + SETTLE_SLACK_S
        start, end = clock.to_mono(fact.deadline), clock.to_mono(fact.settled_at)
        if late and not any(w.kind in SERVER_SIDE and w.overlaps(start, end) for w in windows):
            problems.append(f"{label}: settled {window_s:.1f}s after its deadline (allowed: one sweep)")
        if t.operation == "nonexistent" and (fact.handed or fact.state not in ("expired", "cancelled")):
            problems.append(
                f"{label}: no collector offers it, yet it is {fact.state} after {fact.handed} runs"
            )
        if fact.state == "failed" and not fact.handed and t.operation != "nonexistent":
            problems.append(f"{label}: failed ({fact.error_code}) without ever being handed to a collector")
        if fact.state == "indeterminate":
            # A one-shot mutation the device did not confirm, or one the platform cancelled after its
            # change began (the collector's report in PostgreSQL says so): both are for an operator.
            cancelled = t.cancel_code == "ok" and fact.stopped_mid_change
            expected = t.operation == "apply_once" and (bool(t.params.get("unclear")) or cancelled)
            holders = {collector_names.get(c, c) for c in fact.collectors}
            created = clock.to_mono(fact.created_at)
            touched = any(w.overlaps(created, end) and (not w.victim or w.victim in holders) for w in windows)
            if not (expected or touched):
                problems.append(
                    f"{label}: indeterminate although no fault touched its holders {sorted(holders)}"
                )
    return problems


def writer_order(devices: Path) -> list[str]:
    """Promise 4 from the devices' own evidence (``<device>.writes``, written by the stub driver)."""
    problems = []
    for evidence in sorted(devices.glob(f"*{WRITES_SUFFIX}")):
        writes = [json.loads(line) for line in evidence.read_text().splitlines() if line]
        writes.sort(key=lambda w: float(w["at"]))
        device = evidence.name.removesuffix(WRITES_SUFFIX)
        highest = 0
        for w in writes:
            if int(w["epoch"]) < highest:
                problems.append(
                    f"{device}: {w['key']} written at lease epoch {w['epoch']} after one at epoch {highest}"
                )
            highest = max(highest, int(w["epoch"]))
            # Collectors and runner share this host's clock: any lateness is a collector's fault.
            # (expires_at 0: a collector that does not tell its driver the window.)
            if int(w["expires_at"]) and float(w["at"]) > float(w["expires_at"]) + 1.0:
                late = float(w["at"]) - float(w["expires_at"])
                problems.append(f"{device}: {w['key']} written {late:.1f}s after its envelope expired")
    return problems


def check_tasks(tasks: Iterable[Submitted], applied: Counter[str], states: dict[str, str]) -> list[str]:
    """``states``: every task in PostgreSQL, idempotency key -> state (the final state of each
    task is taken from here, not from what the runner last heard)."""
    problems = []
    for t in tasks:
        if t.key in states:
            t.state = states[t.key]
        if not t.task_id:
            if t.refused and t.key in states:
                problems.append(f"{t.key}: refused ({t.refused}) but a task exists")
            if t.refused or t.key not in states:
                continue
        if t.state not in TERMINAL:
            problems.append(f"{t.key} ({t.operation} on {t.target}): still {t.state or 'unknown'}")
        if t.operation not in MUTATIONS:
            continue
        n = applied.get(t.key, 0)
        if n > 1:
            problems.append(f"{t.key} ({t.operation}): applied {n} times")
        if t.state == "success" and n != 1:
            problems.append(f"{t.key} ({t.operation}): success but applied {n} times")
        if t.state in ("expired", "cancelled", "failed") and n:
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
    """(monotonic time, line) of every 5xx the gateway answered, from its JSON access log, with the
    cause the gateway logged for that request when it logged one (a dependency it could not
    reach, and the exception's name), so a violation says which dependency failed."""
    records = []
    causes: dict[str, str] = {}
    for line in gateway_log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "unavailable" in str(record.get("event", "")) and record.get("request_id"):
            causes[str(record["request_id"])] = f"{record['event']}: {record.get('error', '?')}"
        elif int(record.get("status", 0) or 0) >= 500:
            records.append(record)
    out = []
    for record in records:
        at = dt.datetime.fromisoformat(str(record.get("timestamp", "")).replace("Z", "+00:00")).timestamp()
        cause = causes.get(str(record.get("request_id", "")))
        out.append(
            (
                started_mono + (at - started_wall),
                f"{record.get('method')} {record.get('path')} {record['status']}"
                + (f" [{cause}]" if cause else ""),
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
        + (
            "(internal error)"
            if _internal(what)
            else "outside any fault window" + _nearest(at, windows, origin)
        )
        for at, what in errors
        if _internal(what) or not any(w.covers(at) for w in windows)
    ]


def _nearest(at: float, windows: Sequence[Window], origin: float) -> str:
    """The server-side fault that ended last before ``at``, to read a violation by."""
    before = [w for w in windows if w.kind in SERVER_SIDE and w.ended <= at]
    if not before:
        return ""
    w = max(before, key=lambda w: w.ended)
    return f" (last server-side fault: {w.kind} +{w.started - origin:.1f}s to +{w.ended - origin:.1f}s)"


def _internal(what: str) -> bool:
    return what.split(" [", 1)[0].endswith(" 500") or "INTERNAL" in what
