"""Reconnect storm: a gateway holding an idle fleet is SIGKILLed and started again at once (as
systemd's ``Restart=always`` would); how long until every collector holds a claim again.

    python -m bench.storm [--fleet 1000,10000] [--runs 1] [--max-handshakes 128,100000]
                          [--router-streams 0,2] [--transport wss|https]
                          [--anonymous-per-source 0|256] [--json FILE]

The fleet (bench/fleet.py: simulated collectors, each keeping a claim held, reconnecting after a
jittered backoff as the reference collector does) connects to a second gateway started beside
``versus-cp up`` (docs/configuration.md, "Another service beside up"), so killing it leaves the
rest of the control plane running. The fleet holds WSS control sockets (what collectors prefer);
a collector is back once its new socket is open — handshake and token check done — and its claim
is sent on it. Measured from the kill: when each collector was back (p50, p90, p99, all), the
handshakes and claims that failed on the way, the 5xx answers, and the CPU of the gateway, the
router and the load generator during the storm.
``--max-handshakes`` sets ``VERSUS_GATEWAY_MAX_HANDSHAKES`` per point; a value above the fleet
turns the listener's bound off, for the comparison (docs/gateway.md, "Storms").

The targets: 99 % back within 60 s, all within 120 s, at 10,000 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.fleet import IdleFleet, cpu_s, make_fleet, service_process
from bench.stack import (
    HOLD_S,
    ROUTER_HOLD_S,
    SimCollector,
    Stack,
    pin_load_generator,
    running_stack,
    save_report,
    unpinned,
)
from bench.targets import STORM_BACK_ALL_S, STORM_BACK_P99_S, ratio
from common.embedded.process import free_port

# How long the storm may take before the run gives up and reports who is still away.
STORM_LIMIT_S = 600.0


class Gateway:
    """A gateway process beside the stack's `up`, on its own port: killable and restartable."""

    def __init__(self, stack: Stack, max_handshakes: int) -> None:
        self.port = free_port()
        self.env = {
            **stack.cp.env,
            "VERSUS_GATEWAY_PORT": str(self.port),
            "VERSUS_GATEWAY_MAX_HANDSHAKES": str(max_handshakes),
        }
        self.log = stack.root / f"gateway-{self.port}.log"
        self.context = stack.ssl_context()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start it; seconds until it answers /readyz."""
        started = time.monotonic()
        # On every CPU, not the load generator's (a child inherits the pin of the thread forking it).
        with self.log.open("ab") as out, unpinned():
            argv = [sys.executable, "-m", "versus_cp", "gateway"]
            self.proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=out)
        # A readiness probe is one more connection in the storm's line: it can wait as long as a collector.
        while time.monotonic() - started < STORM_LIMIT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/readyz", verify=self.context, timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the gateway did not become ready within {STORM_LIMIT_S:.0f} s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

    def process(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)


def _profile(gateway: Gateway, path: str) -> subprocess.Popen[bytes]:
    """py-spy sampling the restarted gateway until the storm ends (a flame graph in ``path``)."""
    spy = Path(sys.executable).with_name("py-spy")
    argv = [str(spy), "record", "-p", str(gateway.process().pid), "-r", "100", "-f", "raw", "-o", path,
            "--nonblocking"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _codes(fleet: list[SimCollector]) -> collections.Counter[str]:
    """Every 5xx the fleet was answered so far, by status and stable code."""
    total: collections.Counter[str] = collections.Counter()
    for c in fleet:
        total.update(c.overloaded_codes)
    return total


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def storm(
    stack: Stack, count: int, max_handshakes: int, profile: str = "", wss: bool = True
) -> dict[str, Any]:
    gateway = Gateway(stack, max_handshakes)
    await asyncio.to_thread(gateway.start)
    fleet = await make_fleet(stack.database_url, gateway.url, stack.ssl_context(), count, f"storm{count}")
    runner = IdleFleet(fleet, wss=wss)
    try:
        ramp_started = time.monotonic()
        await runner.ramp()
        ramp_s = time.monotonic() - ramp_started
        # Settled: first claims answered by the router, the rest parked.
        await asyncio.sleep(min(runner.hold_s, ROUTER_HOLD_S) + 5)
        before = dict(runner.counts)
        errors_before = dict(runner.errors)
        overloaded_before = sum(c.overloaded for c in fleet)
        codes_before = _codes(fleet)
        router, me = service_process(stack, "router"), psutil.Process(os.getpid())
        r0, m0 = cpu_s(router), cpu_s(me)

        killed_at = time.monotonic()
        await asyncio.to_thread(gateway.kill)
        ready_s = await asyncio.to_thread(gateway.start)
        g0 = cpu_s(gateway.process())
        spy = _profile(gateway, profile) if profile else None
        # Every collector notices the loss (its socket or its held request ends) and comes back.
        times = await runner.back_since(killed_at, STORM_LIMIT_S)
        storm_s = time.monotonic() - killed_at
        if not wss:
            # Over HTTPS a collector counts as back once its claim is sent, before the gateway has
            # admitted, authenticated or answered it: the answers (a refusal such as 503
            # too_many_connections, or the claim held) come within a hold, so the run looks that long.
            await asyncio.sleep(HOLD_S + 10)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await asyncio.to_thread(spy.wait, 60)
        gateway_cpu, router_cpu, own_cpu = (
            cpu_s(gateway.process()) - g0,
            cpu_s(router) - r0,
            cpu_s(me) - m0,
        )
        result = {
            "collectors": count,
            "transport": "wss" if wss else "https",
            "max_handshakes": max_handshakes,
            "ramp_s": ramp_s,
            "gateway_ready_s": ready_s,
            "back": len(times),
            "back_p50_s": statistics.median(times) if times else None,
            "back_p90_s": _percentile(times, 0.90) if times else None,
            "back_p99_s": _percentile(times, 0.99) if times else None,
            "back_all_s": max(times) if len(times) == count else None,
            "storm_window_s": storm_s,
            "connect_retries": runner.counts["connect_retries"] - before["connect_retries"],
            "claim_errors": runner.counts["claim_errors"] - before["claim_errors"],
            "errors_by_type": {
                k: n - errors_before.get(k, 0)
                for k, n in runner.errors.items()
                if n > errors_before.get(k, 0)
            },
            "answers_5xx": sum(c.overloaded for c in fleet) - overloaded_before,
            "answers_5xx_by_code": dict(_codes(fleet) - codes_before),
            "gateway_cpu_s": gateway_cpu,
            "router_cpu_s": router_cpu,
            "load_generator_cpu_s": own_cpu,
        }
    finally:
        await runner.close()
        gateway.stop()
    return result


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--fleet", default="1000,10000")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--max-handshakes", default="128", help="values of VERSUS_GATEWAY_MAX_HANDSHAKES")
    parser.add_argument(
        "--router-streams", default="2", help="values of VERSUS_GATEWAY_ROUTER_STREAMS (0: unary calls)"
    )
    parser.add_argument("--transport", default="wss", choices=["wss", "https"])
    parser.add_argument(
        "--anonymous-per-source",
        default="0",
        help="VERSUS_GATEWAY_MAX_ANONYMOUS_PER_SOURCE (0: none, as behind a balancer; the gateway's "
        "default is 256: the fleet then dials from one address, as behind one NAT)",
    )
    parser.add_argument("--json", dest="json_path", default="bench/results/storm.json")
    parser.add_argument("--profile", default="", help="py-spy's raw samples of the storm, to this file")
    args = parser.parse_args()
    pinning = pin_load_generator()
    results = []
    for count in [int(n) for n in args.fleet.split(",")]:
        for bound in [int(n) for n in args.max_handshakes.split(",")]:
            for streams in args.router_streams.split(","):
                for _ in range(args.runs):
                    env = {
                        "VERSUS_GATEWAY_ROUTER_STREAMS": streams,
                        "VERSUS_GATEWAY_MAX_ANONYMOUS_PER_SOURCE": args.anonymous_per_source,
                    }
                    with running_stack(**env) as stack:
                        wss = args.transport == "wss"
                        results.append(asyncio.run(storm(stack, count, bound, args.profile, wss)))
                    results[-1]["router_streams"] = int(streams)
                    print(json.dumps(results[-1]), flush=True)
    save_report(args.json_path, pinning, args, results)

    def s(value: float | None) -> str:
        return "—" if value is None else f"{value:.0f} s"

    print("| Collectors | Max handshakes | Router streams | Back p50 | p90 | p99 | all | Failed connects "
          "| Failed claims | 5xx | Gateway CPU | Router CPU | p99 / target | all / target |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['collectors']} | {r['max_handshakes']} | {r['router_streams']} "
            f"| {s(r['back_p50_s'])} | {s(r['back_p90_s'])} | {s(r['back_p99_s'])} "
            f"| {s(r['back_all_s'])} | {r['connect_retries']} | {r['claim_errors']} | {r['answers_5xx']} "
            f"| {r['gateway_cpu_s']:.0f} s | {r['router_cpu_s']:.0f} s "
            f"| {ratio(r['back_p99_s'], STORM_BACK_P99_S)} | {ratio(r['back_all_s'], STORM_BACK_ALL_S)} |"
        )
    print(
        f"Targets: 99 % back within {STORM_BACK_P99_S:.0f} s, all within {STORM_BACK_ALL_S:.0f} s "
        "(bench/targets.py)."
    )


if __name__ == "__main__":
    main()
