"""`versus-cp tunnel`: bridge stdin/stdout to a device through a collector, e.g. as an OpenSSH ProxyCommand.

    ssh -o ProxyCommand='versus-cp tunnel --target %h:%p --site site-… --tenant acme' ops@10.0.0.7

The router offers the session to the collector (the one named, or a live one
of the site); once the collector has dialled back, the router answers with the
gateway holding the session and a single-use ticket, and bytes flow between
this command and that gateway directly (docs/gateway.md, "Tunnels"). End of
stdin half-closes the platform's direction. Failures are one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import fcntl
import os
import stat
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

import grpc
import websockets
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc

from common.config.settings import Settings
from common.errors import InvalidArgument, Unavailable
from common.grpc import token_files
from common.grpc.client import aio_channel
from common.tunnel import frames
from common.tunnel.attach import attach, end_reason
from versus_cp import rpc

# stdin is read in pieces of up to this much (a pipe gives what it holds), and sent in frames of
# up to this much; reads wait while this many are queued.
CHUNK_BYTES = 1024 * 1024
QUEUED_READS = 16
PIPE_BYTES = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="device host:port as the collector reaches it")
    parser.add_argument("--collector", default="", help="carry the tunnel through this collector")
    parser.add_argument("--site", default="", help="or through a live collector of this site")
    parser.add_argument("--tenant", default="", help="the site's tenant")


def _target(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgument("--target must be host:port", code="tunnel_target_invalid")
    return host.strip("[]"), int(port)


_REASONS = {
    "target_unreachable": " (the collector could not connect to the target)",
    "collector_did_not_connect": " (no collector dialled back in time)",
    "collector_gone": " (the collector's connection dropped and did not come back in time)",
    "gateway_gone": " (the gateway holding the session went away)",
}


def _start_stdin_reader(loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes]) -> None:
    """Read stdin on a daemon thread; b"" marks its end.

    A thread works for pipes, terminals, files and /dev/null alike. It is a
    daemon so that a tunnel the far side closed ends the command even while
    stdin is still open (an executor thread would block interpreter exit).
    """
    fd = sys.stdin.fileno()

    def pump() -> None:
        while True:
            try:
                data = os.read(fd, CHUNK_BYTES)
            except OSError:
                data = b""
            try:
                asyncio.run_coroutine_threadsafe(chunks.put(data), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is gone: the tunnel is over
            if not data:
                return

    threading.Thread(target=pump, name="stdin", daemon=True).start()


async def _bridge(settings: Settings, args: argparse.Namespace) -> int:
    host, port = _target(args.target)
    loop = asyncio.get_running_loop()
    stdout = os.fdopen(sys.stdout.fileno(), "wb", 0)
    outbox: asyncio.Queue[pb.OpenTunnelRequest | None] = asyncio.Queue(4)

    async def requests() -> AsyncIterator[pb.OpenTunnelRequest]:
        yield pb.OpenTunnelRequest(
            open=pb.TunnelOpen(
                host=host, port=port, collector_id=args.collector, site_id=args.site,
                tenant_id=args.tenant, direct=True,
            )
        )  # fmt: skip
        while (item := await outbox.get()) is not None:
            yield item

    async with aio_channel(settings.router_address, token_files.operator_token(settings)) as channel:
        call = tunnel_pb2_grpc.TunnelServiceStub(channel).OpenTunnel(requests())
        first: pb.OpenTunnelResponse | None = None
        try:
            async for reply in call:
                if reply.WhichOneof("msg") in ("ready", "closed"):
                    first = reply
                    break
        except grpc.aio.AioRpcError as exc:
            raise rpc.error_from(exc, settings.router_address) from None
        if first is None or first.WhichOneof("msg") == "closed":
            return _closed(first.closed.reason if first is not None else "router_gone")
        chunks: asyncio.Queue[bytes] = asyncio.Queue(QUEUED_READS)
        _widen_pipes()
        if not first.ready.attach_url:
            # A router from before direct attachment carries the bytes on this stream.
            _start_stdin_reader(loop, chunks)
            return await _relay(call, outbox, chunks, stdout, settings.router_address)
        outbox.put_nowait(None)
        call.cancel()
        _start_stdin_reader(loop, chunks)
        return await _attach(first.ready, chunks, stdout)


async def _attach(ready: pb.TunnelReady, chunks: asyncio.Queue[bytes], stdout: BinaryIO) -> int:
    """Bridge stdin/stdout with the session on the gateway that holds it (its ticket is the credential)."""
    try:
        ws = await attach(ready.attach_url, ready.ticket)
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        raise Unavailable(
            f"cannot attach to the gateway holding the tunnel ({ready.attach_url}): {exc}",
            code="tunnel_attach_failed",
        ) from None

    async def pump() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                frame, more = _coalesced(chunks, await chunks.get())
                if frame:
                    await ws.send(frame)
                if not more:
                    break
            await ws.send(frames.EOF)

    pumping = asyncio.create_task(pump())
    try:
        async for message in ws:  # ends when the gateway closes the socket: the session is over
            if isinstance(message, bytes):
                stdout.write(message)
    except websockets.ConnectionClosed:
        pass
    finally:
        pumping.cancel()
    return _closed(end_reason(ws))


async def _relay(
    call: Any,
    outbox: asyncio.Queue[pb.OpenTunnelRequest | None],
    chunks: asyncio.Queue[bytes],
    stdout: BinaryIO,
    address: str,
) -> int:
    """Bridge stdin/stdout over the router's own stream (routers before direct attachment)."""

    async def pump() -> None:
        while data := await chunks.get():
            await outbox.put(pb.OpenTunnelRequest(data=data))
        await outbox.put(pb.OpenTunnelRequest(close_write=True))

    pumping = asyncio.create_task(pump())
    try:
        async for reply in call:
            kind = reply.WhichOneof("msg")
            if kind == "data":
                stdout.write(reply.data)
            elif kind == "closed":
                return _closed(reply.closed.reason)
    except grpc.aio.AioRpcError as exc:
        raise rpc.error_from(exc, address) from None
    finally:
        pumping.cancel()
    return 0


def _coalesced(chunks: asyncio.Queue[bytes], first: bytes) -> tuple[bytes, bool]:
    """``first`` and what else stdin has queued, as long as it fits one frame (1 MiB): ssh writes
    in small pieces, and a frame costs the same on every hop whatever its size. Returns the frame
    and whether stdin goes on (b"" in the queue is its end)."""
    if not first:
        return b"", False
    parts, size = [first], len(first)
    while not chunks.empty() and size + len(chunks._queue[0]) <= CHUNK_BYTES:  # type: ignore[attr-defined]
        data = chunks.get_nowait()
        if not data:
            return b"".join(parts), False
        parts.append(data)
        size += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts), True


def _widen_pipes() -> None:
    """Let the pipes to ssh hold 1 MiB (Linux's default is 64 KiB): fewer, larger reads and writes."""
    for fd in (sys.stdin.fileno(), sys.stdout.fileno()):
        with contextlib.suppress(OSError, AttributeError):
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _closed(reason: str) -> int:
    """The exit status for a session that ended with ``reason`` (anything but done is a failure)."""
    if reason in ("done", ""):
        return 0
    print(f"versus-cp: tunnel closed: {reason}{_REASONS.get(reason, '')}", file=sys.stderr)
    return 1


def run(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(_bridge(settings, args))
