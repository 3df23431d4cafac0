"""Overload: a fleet ramping into a gateway on a machine that has another workload, with clients
that give up on a claim unanswered for 45 s — does the fleet converge, and does it stay?

    python -m bench.overload [--fleet 3000] [--rate 120] [--deadline 45] [--hog 1] [--settle 120]
                             [--json FILE]

A CPU hog (``while True: pass``) is pinned to CPU 0; the load generator is pinned to CPU 1 as in
every benchmark here; the control plane runs unpinned, so it shares both cores with them. The
fleet (bench/fleet.py) opens WSS control sockets at ``--rate`` a second and keeps a claim held on
each; a claim unanswered ``--deadline`` seconds after it was sent is given up and its socket
closed, and the collector comes back on a new one after a jittered backoff — the collector of
issue 46 whose fleet collapsed (live 1,958, then 592 to 924, never recovering). Measured: the live
count each second (collectors with a claim held on an open socket), when it first reached the
fleet, its lowest afterwards over ``--settle`` seconds, claims given up, how late past the hold
the gateway answered claims that brought nothing, the 5xx answers by code, and the CPU of the
gateway and the router.

Converged means the live count reached the fleet; stayed means it never fell below it again
for longer than one reconnection (a collector whose socket the run's own scheduling dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import psutil

from bench.fleet import IdleFleet, cpu_s, make_fleet, service_process
from bench.stack import HOLD_S, Stack, pin_load_generator, running_stack, save_report
from bench.storm import Gateway, _codes, _percentile

HOG = "while True: pass"


def start_hog(cpu: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", HOG])
    psutil.Process(proc.pid).cpu_affinity([cpu])
    return proc


async def overload(
    stack: Stack, count: int, rate: int, deadline_s: float, hog: bool, settle_s: float
) -> dict[str, Any]:
    gateway = Gateway(stack, 64)
    await asyncio.to_thread(gateway.start)
    fleet = await make_fleet(stack.database_url, gateway.url, stack.ssl_context(), count, f"ovl{count}")
    hog_proc = start_hog(0) if hog else None
    # Each claim asks for the long-poll's hold, so lateness is measured against a short cycle.
    runner = IdleFleet(fleet, wss=True, claim_deadline_s=deadline_s, hold_s=HOLD_S)
    timeline: list[int] = []
    router = service_process(stack, "router")
    g0, r0 = cpu_s(gateway.process()), cpu_s(router)
    started = time.monotonic()
    try:
        starting = asyncio.create_task(runner.start(batch=max(1, rate // 10), pause_s=0.1))
        reached_at: float | None = None
        limit = count / rate + 300  # the ramp and five minutes more
        while time.monotonic() - started < limit:
            await asyncio.sleep(1.0)
            timeline.append(len(runner.online))
            if reached_at is None and timeline[-1] == count:
                reached_at = time.monotonic() - started
            if reached_at is not None and time.monotonic() - started >= reached_at + settle_s:
                break
        await starting
        after = timeline[int(reached_at) :] if reached_at is not None else []
        late = sorted(runner.late_s)
        return {
            "collectors": count,
            "rate_per_s": rate,
            "claim_deadline_s": deadline_s,
            "cpu_hog": hog,
            "hold_s": HOLD_S,
            "converged_s": reached_at,
            "peak_live": max(timeline),
            "lowest_live_after_converged": min(after) if after else None,
            "seconds_below_fleet_after_converged": sum(1 for n in after if n < count),
            "claim_timeouts": runner.counts["claim_timeouts"],
            "drops": runner.counts["drops"],
            "connect_retries": runner.counts["connect_retries"],
            "errors_by_type": dict(runner.errors),
            "empty_claims_answered": len(late),
            "late_past_hold_p99_s": _percentile(late, 0.99) if late else None,
            "late_past_hold_max_s": late[-1] if late else None,
            "answers_5xx_by_code": dict(_codes(fleet)),
            "gateway_cpu_s": cpu_s(gateway.process()) - g0,
            "router_cpu_s": cpu_s(router) - r0,
            "timeline_live": timeline,
        }
    finally:
        if hog_proc is not None:
            hog_proc.kill()
        await runner.close()
        gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fleet", type=int, default=3000)
    parser.add_argument("--rate", type=int, default=120)
    parser.add_argument("--deadline", type=float, default=45.0)
    parser.add_argument("--hog", type=int, default=1, help="1: a CPU hog pinned to CPU 0; 0: none")
    parser.add_argument("--settle", type=float, default=120.0, help="seconds watched after convergence")
    parser.add_argument("--json", dest="json_path", default="bench/results/overload.json")
    args = parser.parse_args()
    pinning = pin_load_generator()
    with running_stack() as stack:
        result = asyncio.run(
            overload(stack, args.fleet, args.rate, args.deadline, bool(args.hog), args.settle)
        )
    shown = {k: v for k, v in result.items() if k != "timeline_live"}
    print(json.dumps(shown))
    save_report(args.json_path, pinning + "; a CPU hog pinned to CPU 0" * args.hog, args, [result])


if __name__ == "__main__":
    main()
