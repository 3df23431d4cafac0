"""End-to-end throughput beside pgqueuer moving the same number of jobs on the same PostgreSQL.

    python -m bench.throughput [--collectors 64] [--tasks 2000] [--in-flight 64] [--batch 16]
                               [--runs 3] [--router-streams 2|0,2] [--json FILE]

Ours: ``--tasks`` read tasks submitted one at a time over gRPC (at most
``--in-flight`` outstanding) to ``--collectors`` simulated collectors on HTTPS
(bench/stack.py: real tokens, real envelope verification), each claiming,
verifying and reporting success. Throughput is tasks per second from the first
submit to the last success acknowledged by the router; CPU milliseconds per
task are split by process (router, gateway, PostgreSQL, Redis, load generator). A separate
untimed pass of ``--count-tasks`` counts the SQL statements per task each service sends, from
PostgreSQL's own statement log (bench/statements.py).

Two variants. *Single*: each collector runs one task at a time and claims one
task per claim. *Batched*: each collector declares ``--batch`` slots and claims
up to ``--batch`` tasks per claim (``max_tasks``), running them concurrently.

Peer, same PostgreSQL server: pgqueuer (asyncpg driver) with jobs enqueued one
at a time (same in-flight bound), dequeued by one worker and marked done by an
empty handler; jobs per second from the first enqueue to the last completion.
Its single variant dequeues one job per query (``batch_size=1``), its batched
variant ``--batch`` per query (pgqueuer's batched drain).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import json
import statistics
import time
from typing import Any

import psycopg
from google.protobuf.timestamp_pb2 import Timestamp
from redis.asyncio import Redis
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from bench.latency import install_pgqueuer
from bench.measure import CpuMeter, profiling
from bench.stack import (
    HOLD_S,
    SimCollector,
    Stack,
    enroll_many,
    pin_load_generator,
    running_stack,
    save_report,
)
from bench.statements import counting
from common.db.urls import libpq_url
from common.grpc.client import aio_channel

# No task finished for this long: the watchdog prints where the tasks are.
STALL_S = 3.0


async def run_ours(
    stack: Stack, site_id: str, fleet: list[SimCollector], token: str, args: Any, batch: int
) -> dict[str, Any]:
    done = asyncio.Event()
    completed: set[str] = set()
    finished: list[float] = []
    stop = asyncio.Event()

    async def run_one(c: SimCollector, raw: bytes) -> None:
        key = json.loads(raw)["idempotency_key"]
        if await c.report_https(c.verify(raw)):
            completed.add(key)  # a task re-run after a lost answer counts once
            finished.append(time.perf_counter())
            if len(completed) == args.tasks:
                done.set()

    async def collector(c: SimCollector) -> None:
        while not stop.is_set():
            if batch == 1:
                raw = await c.claim_https(HOLD_S)
                envelopes = [raw] if raw is not None else []
            else:
                envelopes = await c.claim_batch_https(HOLD_S, batch)
            await asyncio.gather(*(run_one(c, raw) for raw in envelopes))

    meter = CpuMeter(stack)
    loops = [asyncio.create_task(collector(c)) for c in fleet]
    await asyncio.sleep(1.0)
    before = meter.snapshot()
    gate = asyncio.Semaphore(args.in_flight)
    run_id = time.monotonic_ns()
    profile, args.profile_router = args.profile_router, None  # one profile: the first timed run
    async with profiling(meter, "router", profile), aio_channel(stack.router_address, token) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)

        async def submit(i: int) -> None:
            deadline = Timestamp()
            deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10))
            async with gate:
                await stub.SubmitTask(
                    pb.SubmitTaskRequest(
                        provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ,
                        target_ref=f"dev-{i % 500}", site_id=site_id, tenant_id="bench", params=b"{}",
                        idempotency_key=f"tp-{run_id}-{i}", deadline=deadline,
                    )
                )  # fmt: skip

        started = time.perf_counter()
        watchdog = asyncio.create_task(_watch_for_stalls(stack, finished, done))
        await asyncio.gather(*(submit(i) for i in range(args.tasks)))
        await asyncio.wait_for(done.wait(), 300)
        watchdog.cancel()
        elapsed = time.perf_counter() - started
    cpu = CpuMeter.delta(before, meter.snapshot())
    stop.set()
    # Loops stay parked in held claims; they end with the fleet (the stack is torn down after).
    for loop in loops:
        loop.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    ends = sorted(finished)
    stall = max((b - a for a, b in itertools.pairwise(ends)), default=0.0)
    return {
        "tasks_per_s": args.tasks / elapsed,
        "longest_gap_between_completions_s": stall,
        "phases_ms": await _phases(stack, f"tp-{run_id}-"),
        "cpu_ms_per_task": {k: v / args.tasks * 1000 for k, v in cpu.items()},
    }


async def run_pgqueuer(url: str, args: Any, batch: int) -> dict[str, float]:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    consumer = await asyncpg.connect(url)
    producer = await asyncpg.connect(url)
    pgq = PgQueuer(AsyncpgDriver(consumer))
    done = asyncio.Event()
    count = [0]

    @pgq.entrypoint("tp")
    async def handle(job: Job) -> None:
        count[0] += 1
        if count[0] == args.tasks:
            done.set()

    runner = asyncio.create_task(pgq.run(batch_size=batch))
    await asyncio.sleep(0.5)
    queries = Queries(AsyncpgDriver(producer))
    gate = asyncio.Semaphore(args.in_flight)

    async def enqueue(i: int) -> None:
        async with gate:
            await queries.enqueue("tp", str(i).encode())

    started = time.perf_counter()
    await asyncio.gather(*(enqueue(i) for i in range(args.tasks)))
    await asyncio.wait_for(done.wait(), 300)
    elapsed = time.perf_counter() - started
    pgq.shutdown.set()
    await asyncio.wait_for(runner, 30)
    await consumer.close()
    await producer.close()
    return {"jobs_per_s": args.tasks / elapsed}


# Where a task's time went, from the timestamps PostgreSQL recorded (p50 and p90, milliseconds).
_PHASES = """
WITH d AS (
    SELECT d.collector_id, t.created_at AS submitted, d.created_at AS placed, d.handed_at, d.reported_at,
           lag(d.reported_at) OVER (PARTITION BY d.collector_id ORDER BY d.created_at) AS slot_freed
    FROM dispatches d JOIN tasks t ON t.task_id = d.task_id
    WHERE t.idempotency_key LIKE %(prefix)s
), phases(name, ms) AS (
    SELECT 'submitted_to_placed', 1000 * extract(epoch FROM placed - submitted) FROM d
    UNION ALL SELECT 'placed_to_claimed', 1000 * extract(epoch FROM handed_at - placed) FROM d
    UNION ALL SELECT 'claimed_to_reported', 1000 * extract(epoch FROM reported_at - handed_at) FROM d
    UNION ALL SELECT 'slot_freed_to_placed', 1000 * extract(epoch FROM placed - slot_freed) FROM d
        WHERE slot_freed IS NOT NULL AND slot_freed < placed
)
SELECT name, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.9) WITHIN GROUP (ORDER BY ms)
FROM phases GROUP BY name"""


async def _phases(stack: Stack, prefix: str) -> dict[str, list[float]]:
    """p50 and p90 of each step of this run's tasks: waiting in the queue for a slot, waiting for
    the collector's claim to take the dispatch, the collector's run and report, and how long a
    collector's freed slot stayed empty before the next placement on it."""
    async with await psycopg.AsyncConnection.connect(libpq_url(stack.database_url)) as conn:
        rows = await (await conn.execute(_PHASES, {"prefix": prefix + "%"})).fetchall()
    return {name: [round(float(p50), 1), round(float(p90), 1)] for name, p50, p90 in rows}


async def _watch_for_stalls(stack: Stack, finished: list[float], done: asyncio.Event) -> None:
    """Print where the tasks are when none has finished for STALL_S (a stall is a defect to find)."""
    reported = 0.0
    while not done.is_set():
        await asyncio.sleep(1.0)
        last = finished[-1] if finished else 0.0
        if not finished or time.perf_counter() - last < STALL_S or last == reported:
            continue
        reported = last
        async with await psycopg.AsyncConnection.connect(libpq_url(stack.database_url)) as conn:
            tasks = await (
                await conn.execute("SELECT state, condition, count(*) FROM tasks GROUP BY 1, 2 ORDER BY 1")
            ).fetchall()
            held = await (
                await conn.execute(
                    "SELECT collector_id, state, count(*) FROM dispatches"
                    " WHERE state IN ('leased', 'dispatched', 'running') GROUP BY 1, 2"
                )
            ).fetchall()
            history = await (
                await conn.execute(
                    "SELECT h.task_id, h.from_state, h.to_state, h.reason, now() - h.at"
                    " FROM task_transitions h JOIN tasks t ON t.task_id = h.task_id"
                    " WHERE t.state NOT IN ('success', 'failed') ORDER BY h.id"
                )
            ).fetchall()
            dispatches = await (
                await conn.execute(
                    "SELECT dispatch_id, collector_id, state, handed_claim_seq, now() - created_at"
                    " FROM dispatches WHERE state IN ('leased', 'dispatched')"
                )
            ).fetchall()
        # What Redis says about the collectors holding them: last claim (seconds ago), session, load.
        redis = Redis.from_url(stack.redis.url, decode_responses=True)
        sessions = {}
        try:
            for _, cid, *_rest in dispatches:
                score = await redis.zscore("versus:live", cid)
                sessions[cid] = {
                    "last_claim_s_ago": None if score is None else round(time.time() - score, 1),
                    "session": await redis.hgetall(f"versus:session:{cid}"),
                    "inflight": await redis.hgetall(f"versus:inflight:{cid}"),
                }
        finally:
            await redis.aclose()
        stall = {"stall_s": round(time.perf_counter() - last, 1), "tasks": tasks, "in_flight": held}
        print(
            json.dumps(
                {**stall, "history": history, "dispatches": dispatches, "redis": sessions}, default=str
            ),
            flush=True,
        )


async def _variant(
    stack: Stack, pgq_url: str, site_id: str, fleet: list[SimCollector], args: Any, batch: int
) -> dict[str, Any]:
    # Each simulated collector declares as many slots as it claims tasks at once.
    epoch = time.time_ns()
    await asyncio.gather(*(c.publish(max_concurrency=batch, epoch=epoch) for c in fleet))
    token = stack.token("platform")
    ours = [await run_ours(stack, site_id, fleet, token, args, batch) for _ in range(args.runs)]
    for r in ours:
        print(json.dumps({"batch": batch, **r}), flush=True)
    statements: dict[str, float] = {}
    if args.count_tasks > 0:
        # A separate, untimed pass: PostgreSQL logs every statement while it runs (bench/statements.py).
        sample = argparse.Namespace(**{**vars(args), "tasks": args.count_tasks})
        with counting(stack.database_url, stack.postgres.log_file) as counted:
            await run_ours(stack, site_id, fleet, token, sample, batch)
        statements = counted.per_task(args.count_tasks)
        print(json.dumps({"batch": batch, "statements_per_task": statements}), flush=True)
        top = counted.top(args.count_tasks)
        print(json.dumps({"batch": batch, "top_statements": top}, indent=1), flush=True)
    peer = [await run_pgqueuer(pgq_url, args, batch) for _ in range(args.runs)]
    print(json.dumps({"batch": batch, "pgqueuer": peer}), flush=True)
    middle = sorted(ours, key=lambda r: r["tasks_per_s"])[len(ours) // 2]
    return {
        "batch": batch,
        "ours_tasks_per_s": statistics.median(r["tasks_per_s"] for r in ours),
        "pgqueuer_jobs_per_s": statistics.median(r["jobs_per_s"] for r in peer),
        "cpu_ms_per_task": middle["cpu_ms_per_task"],
        "statements_per_task": statements,
        "runs": {"ours": ours, "pgqueuer": peer},
    }


async def _bench(stack: Stack, pgq_url: str, args: Any) -> dict[str, Any]:
    site_id, fleet, _ = await enroll_many(stack, args.collectors)
    return {
        "single": await _variant(stack, pgq_url, site_id, fleet, args, 1),
        "batched": await _variant(stack, pgq_url, site_id, fleet, args, args.batch),
    }


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--collectors", type=int, default=64)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="tasks per claim in the batched variant")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--count-tasks", type=int, default=300, help="tasks in the statement-counting pass (0: no such pass)"
    )
    parser.add_argument(
        "--profile-router",
        metavar="SVG",
        help="flame graph of the router (py-spy) over the first timed run (a .txt name: collapsed stacks)",
    )
    parser.add_argument(
        "--router-streams",
        default="2",
        help="Exchange streams per gateway (VERSUS_GATEWAY_ROUTER_STREAMS); a list such as 0,2 runs each "
        "on its own stack, 0 being one unary call per claim and report",
    )
    parser.add_argument("--json", dest="json_path", default="bench/results/throughput.json")
    args = parser.parse_args()
    pinning = pin_load_generator()
    settings = [int(n) for n in args.router_streams.split(",")]
    results: dict[str, Any] = {}
    for streams in settings:
        with running_stack(VERSUS_GATEWAY_ROUTER_STREAMS=str(streams)) as stack:
            pgq_url = install_pgqueuer(stack)
            measured = asyncio.run(_bench(stack, pgq_url, args))
        for name, r in measured.items():
            label = name if len(settings) == 1 else f"{name}, streams {streams}"
            # A setting listed again (0,2,0,2: interleaved, so the machine's drift hits both alike).
            label += "".join(f" #{n}" for n in [sum(k.startswith(label) for k in results) + 1] if n > 1)
            results[label] = {**r, "router_streams": streams}
    save_report(args.json_path, pinning, args, results)
    print("| Variant | Ours tasks/s | pgqueuer jobs/s | Ratio (ours / pgqueuer) |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        ratio = r["ours_tasks_per_s"] / r["pgqueuer_jobs_per_s"]
        label = f"{name} (batch {r['batch']})"
        print(f"| {label} | {r['ours_tasks_per_s']:.0f} | {r['pgqueuer_jobs_per_s']:.0f} | {ratio:.2f} |")
    for name, r in results.items():
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_ms_per_task"].items())
        print(f"CPU ms per task, {name}: {cpu}")
        if r["statements_per_task"]:
            sql = ", ".join(f"{k} {v:.1f}" for k, v in r["statements_per_task"].items())
            print(f"SQL statements per task (from PostgreSQL's log), {name}: {sql}")


if __name__ == "__main__":
    main()
