"""`versus-cp tunnel`: bridge stdin/stdout to a device through a collector, e.g. as an OpenSSH ProxyCommand.

    ssh -o ProxyCommand='versus-cp tunnel --target %h:%p --site site-… --tenant acme' ops@10.0.0.7

The router offers the session to the collector (the one named, or a live one
of the site); once the collector has dialled back, bytes flow both ways. End
of stdin half-closes the platform's direction. Failures are one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import AsyncIterator

import grpc
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc

from common.errors import InvalidArgument, Unavailable, VersusError
from common.settings import Settings

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


async def _bridge(settings: Settings, args: argparse.Namespace) -> int:
    host, port = _target(args.target)
    loop = asyncio.get_running_loop()
    stdin_fd = sys.stdin.fileno()
    stdout = os.fdopen(sys.stdout.fileno(), "wb", 0)
    ready = asyncio.Event()

    async def requests() -> AsyncIterator[pb.OpenTunnelRequest]:
        yield pb.OpenTunnelRequest(
            open=pb.TunnelOpen(
                host=host, port=port, collector_id=args.collector, site_id=args.site, tenant_id=args.tenant
            )
        )
        await ready.wait()
        # A thread reads stdin: it works for pipes, terminals, files and /dev/null alike.
        while data := await loop.run_in_executor(None, os.read, stdin_fd, CHUNK_BYTES):
            yield pb.OpenTunnelRequest(data=data)
        yield pb.OpenTunnelRequest(close_write=True)

    async with grpc.aio.insecure_channel(settings.router_address) as channel:
        try:
            async for reply in tunnel_pb2_grpc.TunnelServiceStub(channel).OpenTunnel(requests()):
                kind = reply.WhichOneof("msg")
                if kind == "ready":
                    ready.set()
                elif kind == "data":
                    stdout.write(reply.data)
                elif kind == "closed" and reply.closed.reason not in ("done", ""):
                    print(f"versus-cp: tunnel closed: {reply.closed.reason}", file=sys.stderr)
                    return 1
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise Unavailable(f"cannot reach the router at {settings.router_address}") from None
            raise VersusError(exc.details() or exc.code().name) from None
    return 0


def run(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(_bridge(settings, args))
