"""Tunnel throughput and round-trip time beside raw loopback TCP and websockify, in one run.

    python -m bench.tunnel [--mib 16] [--streams 1,8] [--pings 500] [--runs 3] [--json FILE]

Every path ends at the same local TCP echo server:

- *raw*: a TCP connection straight to the echo server (the physical limit here);
- *websockify*: a `websockify` process relaying an unencrypted WebSocket to it,
  driven by a `websockets` client (one hop, no TLS);
- *stunnel*: Debian's `stunnel4` terminating TLS (the gateway's own certificate and key) and
  relaying plain TCP to it (one hop that pays for TLS, as the gateway's does);
- *ours*: `TunnelService/OpenTunnel` on the router (gRPC) → router → gateway
  (WSS, TLS on, as deployed) → a real `versus-collector` process → the echo
  server; every byte crosses four hops each way.

Throughput: ``--mib`` MiB per stream sent and echoed back, ``--streams``
concurrent streams, MiB/s of payload echoed. Round trip: ``--pings`` 64-byte
messages, one at a time, p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import websockets
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc
from websockets.typing import Subprotocol

from bench.measure import percentile
from bench.stack import Stack, pin_load_generator, running_stack, save_report, unpinned
from common.embedded.process import free_port
from common.grpc.client import aio_channel
from common.tunnel.attach import attach
from tests.e2e.collector_harness import Collector
from tests.support import netns

CHUNK = 64 * 1024
COALESCE_BYTES = 1024 * 1024


class Pipe:
    """One byte stream to the echo server: send, receive exactly n bytes, close."""

    send: Callable[[bytes], Awaitable[None]]
    recv: Callable[[], Awaitable[bytes]]
    close: Callable[[], Awaitable[None]]

    def __init__(self) -> None:
        self.buffer = bytearray()

    async def read_exactly(self, n: int) -> None:
        while len(self.buffer) < n:
            self.buffer += await self.recv()
        del self.buffer[:n]


async def echo_server() -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the benchmark is over or the client hung up
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def raw_pipe(port: int, context: ssl.SSLContext | None = None, server_name: str | None = None) -> Pipe:
    """A TCP connection to ``port`` (the echo server, or with ``context`` the stunnel relay)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_name
    )
    pipe = Pipe()

    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def recv() -> bytes:
        return await reader.read(CHUNK)

    async def close() -> None:
        writer.close()

    pipe.send, pipe.recv, pipe.close = send, recv, close
    return pipe


def _stunnel_config(stack: Stack, accept: int, connect: int) -> Path:
    tls = stack.cp.state_dir / "tls"
    config = stack.root / "stunnel.conf"
    config.write_text(
        "foreground = yes\npid =\n[relay]\n"
        f"accept = 127.0.0.1:{accept}\nconnect = 127.0.0.1:{connect}\n"
        f"cert = {tls / 'gateway.pem'}\nkey = {tls / 'gateway.key'}\n"
    )
    return config


async def websockify_pipe(ws_port: int) -> Pipe:
    ws = await websockets.connect(
        f"ws://127.0.0.1:{ws_port}/", subprotocols=[Subprotocol("binary")], max_size=None
    )
    pipe = Pipe()

    async def send(data: bytes) -> None:
        await ws.send(data)

    async def recv() -> bytes:
        data = await ws.recv()
        return data if isinstance(data, bytes) else data.encode()

    async def close() -> None:
        await ws.close()

    pipe.send, pipe.recv, pipe.close = send, recv, close
    return pipe


async def tunnel_pipe(stack: Stack, token: str, collector_id: str, port: int, direct: bool = True) -> Pipe:
    """A session through the control plane: ``OpenTunnel`` on the router, then (``direct``) the
    bytes on a WebSocket to the gateway holding the session, or on the router's stream."""
    channel = aio_channel(stack.router_address, token)
    opened = pb.TunnelOpen(host="127.0.0.1", port=port, collector_id=collector_id, direct=direct)
    outbox: asyncio.Queue[pb.OpenTunnelRequest | None] = asyncio.Queue(16)

    async def requests() -> AsyncIterator[pb.OpenTunnelRequest]:
        yield pb.OpenTunnelRequest(open=opened)
        while (item := await outbox.get()) is not None:
            yield item

    call = tunnel_pb2_grpc.TunnelServiceStub(channel).OpenTunnel(requests())
    first = cast(pb.OpenTunnelResponse, await call.read())
    if first.WhichOneof("msg") != "ready":
        raise RuntimeError(f"tunnel did not open: {first}")
    pipe = Pipe()
    if direct:
        await outbox.put(None)
        await channel.close(None)
        return await _attached_pipe(pipe, first.ready)

    async def send(data: bytes) -> None:
        await outbox.put(pb.OpenTunnelRequest(data=data))

    async def recv() -> bytes:
        while True:
            reply = cast(pb.OpenTunnelResponse | None, await call.read())
            kind = reply.WhichOneof("msg") if reply is not None else None
            if kind == "data":
                return bytes(reply.data) if reply is not None else b""
            if kind is None or kind == "closed":
                raise RuntimeError("tunnel closed")

    async def close() -> None:
        await outbox.put(None)
        call.cancel()
        await channel.close(None)

    pipe.send, pipe.recv, pipe.close = send, recv, close
    return pipe


async def _attached_pipe(pipe: Pipe, ready: pb.TunnelReady) -> Pipe:
    """The pipe over the gateway's attach socket. Blocks written while the previous frame was being
    sent leave together, up to 1 MiB a frame: a platform client moves data in large chunks (as
    versus-cp does, reading stdin up to 1 MiB at a time)."""
    ws = await attach(ready.attach_url, ready.ticket)
    pending: list[bytes] = []
    sending = False
    queued = sent = 0  # blocks handed to send(), blocks gone out
    progress = asyncio.Condition()

    async def send(data: bytes) -> None:
        # The caller that finds no send in progress sends its block and whatever other callers
        # added meanwhile (up to 1 MiB a frame); a caller arriving during a send adds its block
        # and waits until it has left (that bounds what is pending).
        nonlocal sending, queued, sent
        pending.append(data)
        queued += 1
        mine = queued
        if sending:
            async with progress:
                await progress.wait_for(lambda: sent >= mine)
            return
        sending = True
        try:
            while pending:
                size, taken = 0, 0
                while taken < len(pending) and (not taken or size + len(pending[taken]) <= COALESCE_BYTES):
                    size += len(pending[taken])
                    taken += 1
                frame = pending[0] if taken == 1 else b"".join(pending[:taken])
                del pending[:taken]
                await ws.send(frame)
                sent += taken
                async with progress:
                    progress.notify_all()
        finally:
            sending = False

    async def recv() -> bytes:
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                return message

    async def close() -> None:
        await ws.close()

    pipe.send, pipe.recv, pipe.close = send, recv, close
    return pipe


async def throughput(open_pipe: Callable[[], Awaitable[Pipe]], streams: int, mib: int) -> float:
    """MiB/s of payload sent and echoed back, over ``streams`` concurrent pipes."""
    pipes = [await open_pipe() for _ in range(streams)]
    block = os.urandom(CHUNK)
    total = mib * 1024 * 1024

    async def one(pipe: Pipe) -> None:
        async def writer() -> None:
            for _ in range(total // CHUNK):
                await pipe.send(block)

        sending = asyncio.create_task(writer())
        await pipe.read_exactly(total)
        await sending

    started = time.perf_counter()
    await asyncio.gather(*(one(p) for p in pipes))
    elapsed = time.perf_counter() - started
    for pipe in pipes:
        await pipe.close()
    return streams * mib / elapsed


async def round_trips(open_pipe: Callable[[], Awaitable[Pipe]], pings: int) -> tuple[float, float]:
    pipe = await open_pipe()
    message = b"x" * 64
    samples = []
    for _ in range(pings):
        started = time.perf_counter()
        await pipe.send(message)
        await pipe.read_exactly(len(message))
        samples.append(time.perf_counter() - started)
    await pipe.close()
    return percentile(samples, 0.5) * 1000, percentile(samples, 0.99) * 1000


async def _bench(stack: Stack, collector_id: str, token: str, args: argparse.Namespace) -> dict[str, Any]:
    server, port = await echo_server()
    ws_port = free_port()
    websockify = shutil.which("websockify", path=str(Path(sys.executable).parent)) or "websockify"
    with unpinned():  # a server, like ours: not on the load generator's CPU
        relay = await asyncio.create_subprocess_exec(
            websockify,
            f"127.0.0.1:{ws_port}",
            f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        tls_port = free_port()
        stunnel = await asyncio.create_subprocess_exec(
            shutil.which("stunnel") or "stunnel",
            str(_stunnel_config(stack, tls_port, port)),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    await asyncio.sleep(1.0)
    server_name = urlsplit(stack.gateway_url).hostname or "127.0.0.1"
    paths: dict[str, Callable[[], Awaitable[Pipe]]] = {
        "raw": lambda: raw_pipe(port),
        "websockify": lambda: websockify_pipe(ws_port),
        "stunnel": lambda: raw_pipe(tls_port, stack.ssl_context(), server_name),
        "ours": lambda: tunnel_pipe(stack, token, collector_id, port),
    }
    results: dict[str, Any] = {}
    try:
        for name, opener in paths.items():
            for streams in args.streams:
                runs = [await throughput(opener, streams, args.mib) for _ in range(args.runs)]
                results[f"{name}_mibps_{streams}"] = statistics.median(runs)
                print(
                    f"{name} {streams} stream(s): {results[f'{name}_mibps_{streams}']:.1f} MiB/s", flush=True
                )
            rtts = [await round_trips(opener, args.pings) for _ in range(args.runs)]
            results[f"{name}_rtt_p50_ms"] = statistics.median(r[0] for r in rtts)
            results[f"{name}_rtt_p99_ms"] = statistics.median(r[1] for r in rtts)
            print(f"{name} rtt p50 {results[f'{name}_rtt_p50_ms']:.2f} ms", flush=True)
    finally:
        for process in (relay, stunnel):
            process.terminate()
            await process.wait()
        server.close()
    return results


def _scp_seconds(image: Path, device: netns.OpenSsh, proxy_command: str | None) -> float:
    """Seconds for OpenSSH's scp (the classic protocol, as a device's CLI takes it) to copy
    ``image`` to the device's /dev/null, straight or through ``proxy_command``."""
    known = device.client_key.parent / "known_hosts"
    host = "device-behind-the-collector" if proxy_command else device.address
    known.write_text(f"{host} {device.host_key}\n")
    via = ["-o", f"ProxyCommand={proxy_command}"] if proxy_command else []
    started = time.perf_counter()
    scp = shutil.which("scp") or "/usr/bin/scp"
    subprocess.run(
        [scp, "-O", "-q", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
         *via, "-i", str(device.client_key), str(image), f"root@{host}:/dev/null"],
        check=True, timeout=600,
    )  # fmt: skip
    return time.perf_counter() - started


def scp_rows(stack: Stack, collector: Collector, args: argparse.Namespace) -> dict[str, float]:
    """scp of ``--scp-mib`` MiB through `versus-cp tunnel` and straight to the same sshd (Debian's,
    in a network namespace), medians of ``--runs``, MiB/s."""
    image = stack.root / "image.bin"
    with image.open("wb") as f:
        for _ in range(args.scp_mib // 64):
            f.write(os.urandom(64 * 1024 * 1024))
    results: dict[str, float] = {}
    with netns.host() as where, netns.openssh_server(where, stack.root / "sshd") as device:
        proxy = shlex.join([sys.executable, "-m", "versus_cp", "tunnel", "--target", f"{device.address}:22",
                            "--site", collector.site_id, "--tenant", "acme"])  # fmt: skip
        for name, command in (("scp_direct", None), ("scp_ours", proxy)):
            runs = [args.scp_mib / _scp_seconds(image, device, command) for _ in range(args.runs)]
            results[f"{name}_mibps"] = statistics.median(runs)
            print(f"{name}: {results[f'{name}_mibps']:.1f} MiB/s ({', '.join(f'{r:.0f}' for r in runs)})")
    image.unlink()
    return results


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--pings", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scp-mib", type=int, default=1024, help="scp rows: MiB copied (0: no scp rows)")
    parser.add_argument("--json", dest="json_path", default="bench/results/tunnel.json")
    args = parser.parse_args()
    args.streams = [int(s) for s in args.streams.split(",")]
    pinning = pin_load_generator()
    with running_stack() as stack:
        collector = Collector(stack.cp, stack.root / "collector", stack.root / "collector.log")
        collector_id = collector.enroll()
        collector.start()
        try:
            time.sleep(3.0)  # capabilities published, first claim held
            token = stack.token("platform")
            results = asyncio.run(_bench(stack, collector_id, token, args))
            if args.scp_mib:
                os.environ.update(stack.cp.env)  # `versus-cp tunnel` finds the control plane
                results.update(scp_rows(stack, collector, args))
        finally:
            collector.stop()
    save_report(args.json_path, pinning, args, results)
    print("| Path | " + " | ".join(f"{s} stream(s) MiB/s" for s in args.streams) + " | RTT p50 | RTT p99 |")
    print("|---|" + "---:|" * (len(args.streams) + 2))
    for name in ("raw", "websockify", "stunnel", "ours"):
        cells = " | ".join(f"{results[f'{name}_mibps_{s}']:.1f}" for s in args.streams)
        p50, p99 = results[f"{name}_rtt_p50_ms"], results[f"{name}_rtt_p99_ms"]
        print(f"| {name} | {cells} | {p50:.2f} ms | {p99:.2f} ms |")
    for peer in ("websockify", "stunnel"):
        print(f"one stream, ours / {peer}: {results['ours_mibps_1'] / results[f'{peer}_mibps_1']:.2f}")
        if 8 in args.streams:
            print(f"eight streams, ours / {peer}: {results['ours_mibps_8'] / results[f'{peer}_mibps_8']:.2f}")
    if args.scp_mib:
        ratio = results["scp_ours_mibps"] / results["scp_direct_mibps"]
        print(f"scp of {args.scp_mib} MiB, ours / direct: {ratio:.2f}")


if __name__ == "__main__":
    main()
