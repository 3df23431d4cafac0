"""What one gateway → router call costs in transport alone: unary RPCs beside the Exchange stream.

    python -m bench.bridge_calls [--calls 20000] [--concurrency 1,64,1000] [--streams 0,1,2] [--json FILE]

A router process serves ``CollectorBridgeService`` with handlers that answer at once (an empty
claim answer, a report's ack): no PostgreSQL, no Redis, so what is measured is what the design
changes — gRPC, the stream's framing and batching, the interceptors. The gateway side is the
gateway's own ``RouterLink`` (gateway/router_link.py) with ``--streams`` streams (0: one unary
call each, as before the stream), keeping ``--concurrency`` calls open at once (half claims,
half reports, the shapes the gateway sends). Reported per setting: calls per second and CPU
microseconds per call in the caller (getrusage) and in the router process (its /proc times).
The peer is the unary path in the same run, settings interleaved so the machine's drift hits
each alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import time
from typing import Any

import psutil
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import collector_bridge_pb2_grpc

from bench.stack import pin_load_generator, save_report, unpinned
from common.embedded.process import free_port
from common.grpc.client import aio_channel
from gateway.clients import call
from gateway.router_link import RouterLink

TOKEN = "bench-token"  # noqa: S105 - a local process answering only this run


class _Authenticator:
    """The caller is the gateway (role service): RBAC is checked as in production."""

    async def authenticate(self, plaintext: str) -> Any:
        from common.access import rbac

        if plaintext != TOKEN:
            return None
        return rbac.Principal(token_id="bench", name="gateway", role=rbac.Role.SERVICE)  # noqa: S106


class _InstantBridge(collector_bridge_pb2_grpc.CollectorBridgeServiceServicer):
    """Answers at once, as a router whose database work took no time."""

    def __init__(self) -> None:
        from router.dispatch.exchange import BridgeExchange

        self.exchange = BridgeExchange(self)

    async def Claim(self, request: bpb.ClaimRequest, context: Any) -> bpb.ClaimResponse:
        return bpb.ClaimResponse()

    async def Report(self, request: bpb.ReportRequest, context: Any) -> bpb.ReportResponse:
        return bpb.ReportResponse(duplicate=False)

    async def PublishCapabilities(self, request: Any, context: Any) -> Any:
        raise NotImplementedError

    async def Goodbye(self, request: Any, context: Any) -> Any:
        raise NotImplementedError

    async def AppendOutput(self, request: Any, context: Any) -> Any:
        raise NotImplementedError

    async def AckRevocation(self, request: Any, context: Any) -> Any:
        raise NotImplementedError

    def Exchange(self, request_iterator: Any, context: Any) -> Any:
        return self.exchange.serve(request_iterator)


def _serve(port: int, ready: Any) -> None:
    from common.grpc.server import GrpcServer, ServiceRegistration

    async def run() -> None:
        reg = ServiceRegistration(
            "versus.router.v1.CollectorBridgeService",
            _InstantBridge(),
            collector_bridge_pb2_grpc.add_CollectorBridgeServiceServicer_to_server,
        )
        server = GrpcServer("router", "127.0.0.1", port, [reg], _Authenticator())
        await server.start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(run())


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _requests(i: int) -> tuple[str, Any]:
    if i % 2:
        return "report", bpb.ReportRequest(
            collector_id=f"col-{i % 1000}", task_id=f"dsp-{i}", outcome=bpb.REPORT_OUTCOME_SUCCESS,
            result=b'{"ok":true}', signature="x" * 96, idempotency_key=f"k-{i}",
        )  # fmt: skip
    return "claim", bpb.ClaimRequest(
        collector_id=f"col-{i % 1000}", claim_seq=i, session_id="s" * 16, transport="wss",
        free_slots={"stub": 8}, agent_version="1.0.0", protocol_version=7,
    )  # fmt: skip


async def _unary(method: Any, request: Any, request_id: str | None, timeout_s: float) -> Any:
    return await call(method, request, request_id, timeout_s)


async def _drive(
    address: str, streams: int, calls: int, concurrency: int, router: psutil.Process
) -> dict[str, Any]:
    channel = aio_channel(address, TOKEN)
    link = RouterLink(channel, _unary, streams)
    try:
        for i in range(200):  # warm: connections, streams, caches
            await link.call(*_requests(i), None, 10)
        queue = iter(range(calls))

        async def worker() -> None:
            for i in queue:
                await link.call(*_requests(i), None, 10)

        r0, c0, t0 = router.cpu_times(), _cpu_s(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed, c1, r1 = time.perf_counter() - t0, _cpu_s(), router.cpu_times()
    finally:
        await link.close()
        await channel.close(None)
    router_s = (r1.user + r1.system) - (r0.user + r0.system)
    return {
        "streams": streams,
        "concurrency": concurrency,
        "calls": calls,
        "calls_per_s": calls / elapsed,
        "caller_cpu_us_per_call": 1e6 * (c1 - c0) / calls,
        "router_cpu_us_per_call": 1e6 * router_s / calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--concurrency", default="1,64,1000")
    parser.add_argument("--streams", default="0,1,2")
    parser.add_argument("--runs", type=int, default=2, help="each setting this often, interleaved")
    parser.add_argument("--json", dest="json_path", default="bench/results/bridge_calls.json")
    args = parser.parse_args()
    pinning = pin_load_generator()
    port = free_port()
    ready = multiprocessing.get_context("spawn").Event()
    with unpinned():
        server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port, ready), daemon=True)
        server.start()
    if not ready.wait(30):
        raise RuntimeError("the router did not start")
    router = psutil.Process(server.pid)
    results = []
    try:
        for _ in range(args.runs):
            for concurrency in [int(n) for n in args.concurrency.split(",")]:
                for streams in [int(n) for n in args.streams.split(",")]:
                    r = asyncio.run(_drive(f"127.0.0.1:{port}", streams, args.calls, concurrency, router))
                    print(json.dumps(r), flush=True)
                    results.append(r)
    finally:
        server.kill()
    save_report(args.json_path, pinning, args, results)
    print("| Calls open | Streams | Calls/s | Caller CPU µs/call | Router CPU µs/call |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['concurrency']} | {r['streams'] or 'unary'} | {r['calls_per_s']:,.0f} "
            f"| {r['caller_cpu_us_per_call']:.0f} | {r['router_cpu_us_per_call']:.0f} |"
        )


if __name__ == "__main__":
    os.environ.setdefault("VERSUS_LOG_LEVEL", "WARNING")
    main()
