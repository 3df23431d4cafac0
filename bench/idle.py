"""Idle fleet: memory and CPU of one gateway holding many idle collectors, on HTTPS and on WSS.

    python -m bench.idle [--fleet 1000,10000] [--window 30] [--transports https,wss] [--runs 3]
                         [--parking on|off|on,off] [--json FILE]

``--fleet`` simulated collectors (bench/stack.py) each hold a claim at all
times, re-claiming when the 25 s hold ends, over HTTPS long-poll or over the
WSS control socket. Once all are connected, the gateway's resident memory
(RSS) and CPU over ``--window`` seconds are read from /proc, beside an idle
gateway's. The router's CPU is reported too. With ``--parking on,off`` each
point is measured twice in the same run: with idle claims parked in the gateway
(the default, docs/gateway.md "Where a claim waits") and with every claim sent
to the router, as before. Identities are inserted straight into PostgreSQL with
fresh P-256 keys (the enrollment path has its own benchmark); every request
still carries a freshly signed ES256 bearer token.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import statistics
import time
from collections import Counter
from typing import Any

import httpx
import psutil
import websockets
from cryptography.hazmat.primitives import serialization
from sqlalchemy import insert

from bench.stack import HOLD_S, SimCollector, Stack, pin_load_generator, running_stack, save_report
from collector.agent_state import backoff
from common.db import engine as db_engine
from common.db.schema import collectors as collectors_table
from common.db.schema import sites


async def make_fleet(stack: Stack, count: int, tag: str) -> list[SimCollector]:
    context = stack.ssl_context()
    fleet = [SimCollector(f"idle-{tag}-{i:05d}", stack.gateway_url, context) for i in range(count)]
    engine = db_engine.create_async(stack.database_url, pool_size=1)
    site_id = f"site-idle-{tag}"
    async with engine.begin() as conn:
        await conn.execute(insert(sites).values(site_id=site_id, name=site_id, tenant_id="bench"))
        rows = []
        for c in fleet:
            der = c.key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            rows.append(
                {
                    "collector_id": c.collector_id,
                    "site_id": site_id,
                    "tenant_id": "bench",
                    "status": "active",
                    "public_key_der": der,
                    "public_key_sha256": hashlib.sha256(der).digest(),
                    "cert_pem": "",
                    "cert_serial": "0",
                    "cert_not_after": dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
                }
            )
        await conn.execute(insert(collectors_table), rows)
    await engine.dispose()
    return fleet


def _process(stack: Stack, name: str) -> psutil.Process:
    for child in psutil.Process(stack.cp.proc.pid).children(recursive=True):
        if " ".join(child.cmdline()).endswith(f"versus_cp {name}"):
            return child
    raise RuntimeError(f"no {name} process")


# The share of collectors the gateway must hold a connection for before the window starts.
READY_SHARE = 0.98


def _inbound(gateway: psutil.Process, port: int) -> int:
    """Established connections to the gateway's listening port: the collectors it holds."""
    return sum(
        1
        for c in gateway.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


async def hold(stack: Stack, count: int, wss: bool, window: float, parking: bool = True) -> dict[str, Any]:
    fleet = await make_fleet(stack, count, f"{'w' if wss else 'h'}{count}")
    stop = asyncio.Event()
    online: set[str] = set()
    counts = {"connect_retries": 0, "drops": 0, "claim_errors": 0}
    errors: Counter[str] = Counter()
    all_online = asyncio.Event()

    def mark(c: SimCollector, up: bool) -> None:
        if up:
            online.add(c.collector_id)
            if len(online) == count:
                all_online.set()
        elif c.collector_id in online:
            online.discard(c.collector_id)
            counts["drops"] += 1

    async def loop(c: SimCollector) -> None:
        attempt = 0
        while not stop.is_set():
            if wss and not c.ws_open:
                # As the reference collector: a refused or failed handshake (the gateway sheds
                # handshakes during a storm) is retried after a jittered exponential backoff.
                try:
                    await c.open_ws()
                except (OSError, websockets.WebSocketException, TimeoutError):
                    counts["connect_retries"] += 1
                    await asyncio.sleep(backoff(attempt, base=0.5))
                    attempt += 1
                    continue
                attempt = 0
            claim = c.claim_ws(HOLD_S) if wss else c.claim_https(HOLD_S)
            mark(c, True)
            try:
                await claim
            except (ConnectionError, websockets.WebSocketException):
                mark(c, False)
            except (OSError, httpx.HTTPError) as exc:
                # A connect or read that failed under the storm (a timed-out handshake, say): as a
                # collector does, back off and claim again. Before, such an error ended the
                # collector's loop for good and the run measured fewer held claims than it said.
                mark(c, False)
                counts["claim_errors"] += 1
                errors[type(exc).__name__] += 1
                await asyncio.sleep(backoff(attempt, base=0.5))
                attempt += 1
            else:
                attempt = 0

    gateway, router = _process(stack, "gateway"), _process(stack, "router")
    idle_rss = gateway.memory_info().rss
    ramp_started = time.monotonic()
    tasks = []
    for start in range(0, count, 250):  # ramp in batches so handshakes do not time out
        tasks += [asyncio.create_task(loop(c)) for c in fleet[start : start + 250]]
        await asyncio.sleep(0.5)
    await all_online.wait()
    # Ready when the gateway holds a connection for READY_SHARE of the collectors: TLS handshakes
    # take a while at 10k (SYNs beyond the listen backlog are retried after seconds), and at any
    # moment a few collectors are between one connection and the next. Only connections to the
    # gateway's own port count, not its pooled connections to PostgreSQL and Redis.
    port = stack.cp.port("gateway")
    deadline = time.monotonic() + 600
    while _inbound(gateway, port) < READY_SHARE * count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    ramp_s = time.monotonic() - ramp_started
    # Settled: a collector's first claim (a resume) goes to the router, which holds it for a whole
    # hold; only the claims after it park in the gateway. The window starts once they all have.
    await asyncio.sleep(HOLD_S + 5)
    drops_before = counts["drops"]
    g0, r0, t0 = _cpu(gateway), _cpu(router), time.perf_counter()
    await asyncio.sleep(window)
    elapsed = time.perf_counter() - t0
    result = {
        "collectors": count,
        "transport": "wss" if wss else "https",
        "parking": parking,
        "gateway_rss_mib": gateway.memory_info().rss / 2**20,
        "gateway_rss_idle_mib": idle_rss / 2**20,
        "gateway_cpu_pct": (_cpu(gateway) - g0) / elapsed * 100,
        "router_cpu_pct": (_cpu(router) - r0) / elapsed * 100,
        "gateway_connections": _inbound(gateway, port),
        "online_at_end": len(online),
        "ramp_s": ramp_s,
        "connect_retries": counts["connect_retries"],
        "claim_errors": counts["claim_errors"],
        "claim_errors_by_type": dict(errors),
        "drops_during_ramp": drops_before,
        # Must be 0 for the figures to describe a steady fleet.
        "drops_during_window": counts["drops"] - drops_before,
    }
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(c.close() for c in fleet), return_exceptions=True)
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every numeric figure over the runs of one point, with the runs themselves."""
    point = {
        key: statistics.median(run[key] for run in runs) if isinstance(value, int | float) else value
        for key, value in runs[0].items()
    }
    # Drops are not averaged away: any drop in any run shows.
    point["drops_during_window"] = max(run["drops_during_window"] for run in runs)
    point["runs"] = runs
    return point


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--fleet", default="1000,10000")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--transports", default="https,wss", help="https, wss or both")
    parser.add_argument("--runs", type=int, default=3, help="runs per point; the table shows medians")
    parser.add_argument("--parking", default="on", help="on, off or on,off: claims parked in the gateway")
    parser.add_argument("--json", dest="json_path", default="bench/results/idle.json")
    args = parser.parse_args()
    sizes = [int(n) for n in args.fleet.split(",")]
    pinning = pin_load_generator()
    results = []
    for count in sizes:
        for wss in [t == "wss" for t in args.transports.split(",")]:
            for parking in [p == "on" for p in args.parking.split(",")]:
                runs = []
                for _ in range(args.runs):
                    # A fresh control plane per run: memory is measured from a clean gateway.
                    env = {"VERSUS_GATEWAY_PARK_CLAIMS": "true" if parking else "false"}
                    with running_stack(**env) as stack:
                        runs.append(asyncio.run(hold(stack, count, wss, args.window, parking)))
                        print(json.dumps(runs[-1]), flush=True)
                results.append(median_of(runs))
    save_report(args.json_path, pinning, args, results)
    print(
        "| Collectors | Transport | Parking | Gateway RSS | (idle gateway) | Gateway CPU | Router CPU "
        "| Ramp | Handshake retries | Drops in window |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['collectors']} | {r['transport']} | {'on' if r['parking'] else 'off'} "
            f"| {r['gateway_rss_mib']:.0f} MiB "
            f"| {r['gateway_rss_idle_mib']:.0f} MiB "
            f"| {r['gateway_cpu_pct']:.0f} % | {r['router_cpu_pct']:.0f} % "
            f"| {r['ramp_s']:.0f} s | {r['connect_retries']} | {r['drops_during_window']} |"
        )


if __name__ == "__main__":
    main()
