"""Dispatch latency with idle collectors holding long-polls, beside pgqueuer on the same PostgreSQL.

    python -m bench.latency [--collectors 100] [--rates 10,100,500] [--seconds 8] [--runs 3] [--json FILE]

Ours: a platform client submits read tasks over gRPC with Poisson arrivals at
each rate to ``--collectors`` simulated collectors (real HTTPS or WSS, real
bearer tokens, real envelope verification; see bench/stack.py) that hold
claims. Measured per task, all in this process's clock:

- *submit → claim*: from SubmitTask returning to the collector holding the
  verified envelope (negative when the collector had it before the platform's
  call returned; counted as 0) — and from the SubmitTask call starting;
- *report → watch*: from the collector sending its success report to the
  platform's WatchTask stream delivering the terminal state.

Peer, same run, same PostgreSQL server: pgqueuer (asyncpg driver, its fastest
path: LISTEN/NOTIFY wake-up) — enqueue returning → handler starting, at the
same Poisson rates, jobs enqueued one at a time.

Each figure is the median over ``--runs`` runs of that run's percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import psycopg
from google.protobuf.timestamp_pb2 import Timestamp
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from bench.measure import percentile
from bench.stack import (
    HOLD_S,
    SimCollector,
    Stack,
    enroll_many,
    pin_load_generator,
    running_stack,
    save_report,
)
from common.grpc.client import aio_channel


@dataclass
class Samples:
    submit_to_claim: list[float] = field(default_factory=list)
    call_to_claim: list[float] = field(default_factory=list)
    report_to_watch: list[float] = field(default_factory=list)
    submitted: int = 0
    completed: int = 0
    # Calls that failed (the router sheds or cancels calls when far past saturation).
    rpc_errors: int = 0

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {
            "submitted": self.submitted, "completed": self.completed, "rpc_errors": self.rpc_errors,
        }  # fmt: skip
        for name in ("submit_to_claim", "call_to_claim", "report_to_watch"):
            values = getattr(self, name)
            out[f"{name}_p50_ms"] = percentile(values, 0.50) * 1000
            out[f"{name}_p99_ms"] = percentile(values, 0.99) * 1000
        return out


class Fleet:
    """The simulated collectors, each holding a claim at all times while the fleet runs.

    Claims stay held across runs (a cancelled HTTP claim would stay held on the
    server and swallow a later task), so runs share one set of loops per transport.
    """

    def __init__(self, collectors: list[SimCollector], wss: bool):
        self.collectors = collectors
        self.wss = wss
        self.got_claim: dict[str, float] = {}
        self.reported: dict[str, float] = {}
        self.stop = asyncio.Event()
        self.loops: list[asyncio.Task[None]] = []

    async def _loop(self, c: SimCollector) -> None:
        while not self.stop.is_set():
            # Real collectors hold each claim for the server's full hold (25 s by default).
            raw = await (c.claim_ws(HOLD_S) if self.wss else c.claim_https(HOLD_S))
            if raw is None:
                continue
            dispatch_id = c.verify(raw)
            key = json.loads(raw)["idempotency_key"]
            self.got_claim[key] = time.perf_counter()
            self.reported[key] = time.perf_counter()
            await (c.report_ws(dispatch_id) if self.wss else c.report_https(dispatch_id))

    async def start(self) -> None:
        self.loops = [asyncio.create_task(self._loop(c)) for c in self.collectors]
        await asyncio.sleep(1.0)  # every collector holds a claim

    async def finish(self) -> None:
        """Stop claiming; each loop ends when its held claim does (at most one hold)."""
        self.stop.set()
        await asyncio.gather(*self.loops)


async def run_ours(
    stack: Stack, site_id: str, fleet: Fleet, token: str, rate: float, seconds: float
) -> dict[str, float]:
    samples = Samples()
    call_started: dict[str, float] = {}
    returned: dict[str, float] = {}
    run_id = f"{time.monotonic_ns()}"
    got_claim, reported = fleet.got_claim, fleet.reported
    for c in fleet.collectors:
        c.overloaded = 0

    async with aio_channel(stack.router_address, token) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)

        async def submit_and_watch(key: str) -> None:
            deadline = Timestamp()
            deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
            request = pb.SubmitTaskRequest(
                provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ,
                target_ref=f"dev-{random.randrange(1000)}", site_id=site_id, tenant_id="bench",
                params=b"{}", idempotency_key=key, deadline=deadline,
            )  # fmt: skip
            call_started[key] = time.perf_counter()
            try:
                reply = await stub.SubmitTask(request)
                returned[key] = time.perf_counter()
                samples.submitted += 1
                async for update in stub.WatchTask(pb.WatchTaskRequest(task_id=reply.task.task_id)):
                    if update.task.state == task_pb2.TASK_STATE_SUCCESS:
                        seen = time.perf_counter()
                        samples.completed += 1
                        samples.submit_to_claim.append(max(0.0, got_claim[key] - returned[key]))
                        samples.call_to_claim.append(got_claim[key] - call_started[key])
                        samples.report_to_watch.append(seen - reported[key])
            except grpc.aio.AioRpcError:
                samples.rpc_errors += 1

        work: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        next_at = start
        i = 0
        while True:
            next_at += random.expovariate(rate)
            if next_at - start > seconds:
                break
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            work.append(asyncio.create_task(submit_and_watch(f"{run_id}-{i}")))
            i += 1
        await asyncio.wait_for(asyncio.gather(*work), 300)
    summary = samples.summary()
    summary["overloaded_5xx"] = sum(c.overloaded for c in fleet.collectors)
    return summary


async def run_pgqueuer(database_url: str, rate: float, seconds: float) -> dict[str, float]:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    enqueued_at: dict[int, float] = {}
    call_started: dict[int, float] = {}
    after_return: list[float] = []
    after_call: list[float] = []
    consumer = await asyncpg.connect(database_url)
    producer = await asyncpg.connect(database_url)
    pgq = PgQueuer(AsyncpgDriver(consumer))
    done = asyncio.Event()
    expected = [0]

    @pgq.entrypoint("bench")
    async def handle(job: Job) -> None:
        now = time.perf_counter()
        n = int(job.payload or b"0")
        after_call.append(now - call_started[n])
        after_return.append(max(0.0, now - enqueued_at.get(n, now)))
        if len(after_return) == expected[0]:
            done.set()

    runner = asyncio.create_task(pgq.run())
    await asyncio.sleep(0.5)
    queries = Queries(AsyncpgDriver(producer))

    async def enqueue(n: int) -> None:
        call_started[n] = time.perf_counter()
        await queries.enqueue("bench", str(n).encode())
        enqueued_at[n] = time.perf_counter()

    work = []
    start = time.perf_counter()
    next_at = start
    n = 0
    while True:
        next_at += random.expovariate(rate)
        if next_at - start > seconds:
            break
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        work.append(asyncio.create_task(enqueue(n)))
        n += 1
    expected[0] = n
    await asyncio.gather(*work)
    await asyncio.wait_for(done.wait(), 120)
    pgq.shutdown.set()
    await asyncio.wait_for(runner, 30)
    await consumer.close()
    await producer.close()
    return {
        "jobs": n,
        "enqueue_to_start_p50_ms": percentile(after_return, 0.5) * 1000,
        "enqueue_to_start_p99_ms": percentile(after_return, 0.99) * 1000,
        "call_to_start_p50_ms": percentile(after_call, 0.5) * 1000,
        "call_to_start_p99_ms": percentile(after_call, 0.99) * 1000,
    }


def install_pgqueuer(stack: Stack) -> str:
    """A database for pgqueuer on the same server, with its schema; returns its URL."""
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS pgq_bench")
        conn.execute("CREATE DATABASE pgq_bench")
    url = stack.postgres.url_for("pgq_bench")

    async def install() -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(url)
        await Queries(AsyncpgDriver(conn)).install()
        await conn.close()

    asyncio.run(install())
    return url


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


async def _bench(stack: Stack, pgq_url: str, args: argparse.Namespace) -> dict[str, Any]:
    site_id, collectors, _ = await enroll_many(stack, args.collectors)
    await asyncio.gather(*(c.publish() for c in collectors))
    token = stack.token("platform")
    results: dict[str, Any] = {}
    for transport in ("https", "wss"):
        if transport == "wss":
            await asyncio.gather(*(c.open_ws() for c in collectors))
        fleet = Fleet(collectors, wss=transport == "wss")
        await fleet.start()
        for rate in args.rates:
            runs = [
                await run_ours(stack, site_id, fleet, token, rate, args.seconds) for _ in range(args.runs)
            ]
            results[f"ours_{transport}_{rate:g}"] = _median(runs)
            print(f"ours {transport} {rate:g}/s: {results[f'ours_{transport}_{rate:g}']}", flush=True)
        await fleet.finish()
    for rate in args.rates:
        runs = [await run_pgqueuer(pgq_url, rate, args.seconds) for _ in range(args.runs)]
        results[f"pgqueuer_{rate:g}"] = _median(runs)
        print(f"pgqueuer {rate:g}/s: {results[f'pgqueuer_{rate:g}']}", flush=True)
    await asyncio.gather(*(c.close() for c in collectors))
    return results


def _table(results: dict[str, Any], rates: list[float]) -> str:
    lines = [
        "| Rate | Path | submit→claim p50 | p99 | call→claim p50 | report→watch p50 | p99 "
        "| pgqueuer enqueue→start p50 | p99 | p50 ratio (pgqueuer / ours) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rate in rates:
        peer = results[f"pgqueuer_{rate:g}"]
        for transport in ("https", "wss"):
            ours = results[f"ours_{transport}_{rate:g}"]
            ratio = peer["enqueue_to_start_p50_ms"] / max(ours["submit_to_claim_p50_ms"], 1e-6)
            lines.append(
                f"| {rate:g}/s | {transport} | {ours['submit_to_claim_p50_ms']:.1f} ms "
                f"| {ours['submit_to_claim_p99_ms']:.1f} ms "
                f"| {ours['call_to_claim_p50_ms']:.1f} ms | {ours['report_to_watch_p50_ms']:.1f} ms "
                f"| {ours['report_to_watch_p99_ms']:.1f} ms | {peer['enqueue_to_start_p50_ms']:.1f} ms "
                f"| {peer['enqueue_to_start_p99_ms']:.1f} ms | {ratio:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collectors", type=int, default=100)
    parser.add_argument("--rates", default="10,100,500")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", dest="json_path", default="bench/results/latency.json")
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    pinning = pin_load_generator()
    with running_stack() as stack:
        pgq_url = install_pgqueuer(stack)
        results = asyncio.run(_bench(stack, pgq_url, args))
    save_report(args.json_path, pinning, args, results)
    print(_table(results, args.rates))


if __name__ == "__main__":
    main()
