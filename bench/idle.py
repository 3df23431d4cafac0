"""Idle fleet: memory and CPU of one gateway holding many idle collectors, on HTTPS and on WSS.

    python -m bench.idle [--fleet 1000,10000] [--window 30] [--transports https,wss] [--json FILE]

``--fleet`` simulated collectors (bench/stack.py) each hold a claim at all
times, re-claiming when the 25 s hold ends, over HTTPS long-poll or over the
WSS control socket. Once all are connected, the gateway's resident memory
(RSS) and CPU over ``--window`` seconds are read from /proc, beside an idle
gateway's. The router's CPU is reported too: every claim is a heartbeat it
records. Identities are inserted straight into PostgreSQL with fresh P-256
keys (the enrollment path has its own benchmark); every request still carries
a freshly signed ES256 bearer token.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import time
from typing import Any

import psutil
import websockets
from cryptography.hazmat.primitives import serialization
from sqlalchemy import insert

from bench.stack import HOLD_S, SimCollector, Stack, pin_load_generator, running_stack, save_report
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


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


async def hold(stack: Stack, count: int, wss: bool, window: float) -> dict[str, Any]:
    fleet = await make_fleet(stack, count, f"{'w' if wss else 'h'}{count}")
    stop = asyncio.Event()
    connected = [0]
    retries = [0]
    all_connected = asyncio.Event()

    async def loop(c: SimCollector) -> None:
        while wss:
            # During a 10,000-socket ramp the gateway sheds some handshakes; a collector retries.
            try:
                await c.open_ws()
                break
            except (OSError, websockets.WebSocketException, TimeoutError):
                retries[0] += 1
                await asyncio.sleep(1.0)
        first = True
        while not stop.is_set():
            claim = c.claim_ws(HOLD_S) if wss else c.claim_https(HOLD_S)
            if first:
                connected[0] += 1
                if connected[0] == count:
                    all_connected.set()
                first = False
            await claim

    gateway, router = _process(stack, "gateway"), _process(stack, "router")
    idle_rss = gateway.memory_info().rss
    tasks = []
    for start in range(0, count, 250):  # ramp in batches so handshakes do not time out
        tasks += [asyncio.create_task(loop(c)) for c in fleet[start : start + 250]]
        await asyncio.sleep(0.5)
    await all_connected.wait()
    deadline = time.monotonic() + 600
    # Ready when the gateway holds a connection per collector (TLS handshakes take a while at 10k).
    while len(gateway.net_connections(kind="tcp")) < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    await asyncio.sleep(5)  # every claim is parked at the gateway
    g0, r0, t0 = _cpu(gateway), _cpu(router), time.perf_counter()
    await asyncio.sleep(window)
    elapsed = time.perf_counter() - t0
    result = {
        "collectors": count,
        "transport": "wss" if wss else "https",
        "gateway_rss_mib": gateway.memory_info().rss / 2**20,
        "gateway_rss_idle_mib": idle_rss / 2**20,
        "gateway_cpu_pct": (_cpu(gateway) - g0) / elapsed * 100,
        "router_cpu_pct": (_cpu(router) - r0) / elapsed * 100,
        "gateway_connections": len(gateway.net_connections(kind="tcp")),
        "connect_retries": retries[0],
    }
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(c.close() for c in fleet), return_exceptions=True)
    return result


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--fleet", default="1000,10000")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--transports", default="https,wss", help="https, wss or both")
    parser.add_argument("--json", dest="json_path", default="bench/results/idle.json")
    args = parser.parse_args()
    sizes = [int(n) for n in args.fleet.split(",")]
    pinning = pin_load_generator()
    results = []
    for count in sizes:
        for wss in [t == "wss" for t in args.transports.split(",")]:
            # A fresh control plane per point: memory is measured from a clean gateway.
            with running_stack() as stack:
                results.append(asyncio.run(hold(stack, count, wss, args.window)))
                print(json.dumps(results[-1]), flush=True)
    save_report(args.json_path, pinning, args, results)
    print("| Collectors | Transport | Gateway RSS | (idle gateway) | Gateway CPU | Router CPU |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['collectors']} | {r['transport']} | {r['gateway_rss_mib']:.0f} MiB "
            f"| {r['gateway_rss_idle_mib']:.0f} MiB "
            f"| {r['gateway_cpu_pct']:.0f} % | {r['router_cpu_pct']:.0f} % |"
        )


if __name__ == "__main__":
    main()
