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
import json
import statistics
import time
from typing import Any

from bench.fleet import IdleFleet, cpu_s, inbound, make_fleet, service_process
from bench.stack import ROUTER_HOLD_S, Stack, pin_load_generator, running_stack, save_report
from bench.targets import (
    IDLE_FLEET,
    IDLE_GATEWAY_CPU_PCT,
    IDLE_GATEWAY_RSS_MIB,
    IDLE_ROUTER_CPU_PCT,
    idle_ratios,
)

# The share of collectors the gateway must hold a connection for before the window starts.
READY_SHARE = 0.98


async def hold(stack: Stack, count: int, wss: bool, window: float, parking: bool = True) -> dict[str, Any]:
    tag = f"{'w' if wss else 'h'}{count}"
    fleet = await make_fleet(stack.database_url, stack.gateway_url, stack.ssl_context(), count, tag)
    runner = IdleFleet(fleet, wss)
    gateway, router = service_process(stack, "gateway"), service_process(stack, "router")
    idle_rss = gateway.memory_info().rss
    ramp_started = time.monotonic()
    await runner.ramp()  # in batches so handshakes do not time out
    # Ready when the gateway holds a connection for READY_SHARE of the collectors: TLS handshakes
    # take a while at 10k (SYNs beyond the listen backlog are retried after seconds), and at any
    # moment a few collectors are between one connection and the next. Only connections to the
    # gateway's own port count, not its pooled connections to PostgreSQL and Redis.
    port = stack.cp.port("gateway")
    deadline = time.monotonic() + 600
    while inbound(gateway, port) < READY_SHARE * count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    ramp_s = time.monotonic() - ramp_started
    # Settled: a collector's first claim (a resume) goes to the router, which holds it for a whole
    # hold (at most the router's); only the claims after it park in the gateway. The window starts
    # once they all have, and spans at least one whole hold: every collector claims in it again.
    await asyncio.sleep(min(runner.hold_s, ROUTER_HOLD_S) + 5)
    window = max(window, runner.hold_s + 5)
    counts = runner.counts
    drops_before = counts["drops"]
    g0, r0, t0 = cpu_s(gateway), cpu_s(router), time.perf_counter()
    await asyncio.sleep(window)
    elapsed = time.perf_counter() - t0
    result = {
        "collectors": count,
        "transport": "wss" if wss else "https",
        "parking": parking,
        "gateway_rss_mib": gateway.memory_info().rss / 2**20,
        "gateway_rss_idle_mib": idle_rss / 2**20,
        "gateway_cpu_pct": (cpu_s(gateway) - g0) / elapsed * 100,
        "router_cpu_pct": (cpu_s(router) - r0) / elapsed * 100,
        "gateway_connections": inbound(gateway, port),
        "online_at_end": len(runner.online),
        "ramp_s": ramp_s,
        "connect_retries": counts["connect_retries"],
        "claim_errors": counts["claim_errors"],
        "claim_errors_by_type": dict(runner.errors),
        "drops_during_ramp": drops_before,
        # Must be 0 for the figures to describe a steady fleet.
        "drops_during_window": counts["drops"] - drops_before,
    }
    await runner.close()
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
        "| Ramp | Handshake retries | Drops in window "
        "| RSS / target | Gateway CPU / target | Router CPU / target |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        rss, gateway_cpu, router_cpu = idle_ratios(r)
        print(
            f"| {r['collectors']} | {r['transport']} | {'on' if r['parking'] else 'off'} "
            f"| {r['gateway_rss_mib']:.0f} MiB "
            f"| {r['gateway_rss_idle_mib']:.0f} MiB "
            f"| {r['gateway_cpu_pct']:.0f} % | {r['router_cpu_pct']:.0f} % "
            f"| {r['ramp_s']:.0f} s | {r['connect_retries']} | {r['drops_during_window']} "
            f"| {rss} | {gateway_cpu} | {router_cpu} |"
        )
    print(
        f"Targets at {IDLE_FLEET:,} collectors: gateway RSS ≤ {IDLE_GATEWAY_RSS_MIB:.0f} MiB, gateway CPU "
        f"≤ {IDLE_GATEWAY_CPU_PCT:.0f} %, router CPU ≤ {IDLE_ROUTER_CPU_PCT:.0f} % of a core "
        "(bench/targets.py)."
    )


if __name__ == "__main__":
    main()
