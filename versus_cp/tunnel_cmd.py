"""`versus-cp tunnel`: bridge stdin/stdout to a device through a collector, e.g. as an OpenSSH ProxyCommand.

    ssh -o ProxyCommand='versus-cp tunnel --target %h:%p --site site-… --tenant acme' ops@10.0.0.7

The router offers the session to the collector (the one named, or a live one
of the site); once the collector has dialled back, bytes flow both ways. End
of stdin half-closes the platform's direction. Failures are one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import sys
import threading
from collections.abc import AsyncIterator

import grpc
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc

from common.config.settings import Settings
from common.errors import InvalidArgument
from common.grpc import token_files
from common.grpc.client import aio_channel
from versus_cp import rpc

CHUNK_BYTES = 32 * 1024


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
    ready = asyncio.Event()

    async def requests() -> AsyncIterator[pb.OpenTunnelRequest]:
        yield pb.OpenTunnelRequest(
            open=pb.TunnelOpen(
                host=host, port=port, collector_id=args.collector, site_id=args.site, tenant_id=args.tenant
            )
        )
        await ready.wait()
        chunks: asyncio.Queue[bytes] = asyncio.Queue(4)
        _start_stdin_reader(loop, chunks)
        while data := await chunks.get():
            yield pb.OpenTunnelRequest(data=data)
        yield pb.OpenTunnelRequest(close_write=True)

    async with aio_channel(settings.router_address, token_files.operator_token(settings)) as channel:
        try:
            async for reply in tunnel_pb2_grpc.TunnelServiceStub(channel).OpenTunnel(requests()):
                kind = reply.WhichOneof("msg")
                if kind == "ready":
                    ready.set()
                elif kind == "data":
                    stdout.write(reply.data)
                elif kind == "closed" and reply.closed.reason not in ("done", ""):
                    why = _REASONS.get(reply.closed.reason, "")
                    print(f"versus-cp: tunnel closed: {reply.closed.reason}{why}", file=sys.stderr)
                    return 1
        except grpc.aio.AioRpcError as exc:
            raise rpc.error_from(exc, settings.router_address) from None
    return 0


def run(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(_bridge(settings, args))
