"""The gateway's listening socket: accepted connections must get TCP_NODELAY from asyncio."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.embedded.process import free_port
from common.trust.tls import ensure_gateway_tls
from gateway.server import TLS_READ_BUFFER_BYTES, bind, limit_tls_read_buffer


async def test_accepted_connections_have_nodelay() -> None:
    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP; without it a held
    # claim's response (headers, then body) waits ~40 ms on the client's delayed ACK.
    sock = bind("127.0.0.1", free_port())
    assert sock.proto == socket.IPPROTO_TCP
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        _, writer = await asyncio.open_connection(*sock.getsockname())
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    assert seen and seen[0] != 0


async def test_accepted_tls_connections_read_through_a_small_buffer(tmp_path: Path) -> None:
    # asyncio's default is a 256 KiB read buffer per TLS connection: 2.5 GiB for 10,000 parked
    # collectors. The gateway lowers it before serving.
    from asyncio import sslproto

    tls = ensure_gateway_tls(tmp_path, "gw.test", [])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tls.cert_file, tls.key_file)
    client_ctx = ssl.create_default_context(cafile=str(tls.ca_file))
    buffers: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_protocol: Any = writer.transport._ssl_protocol  # type: ignore[attr-defined]
        buffers.append(len(ssl_protocol._ssl_buffer))
        writer.close()

    default = sslproto.SSLProtocol.max_size
    try:
        limit_tls_read_buffer()
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
        async with server:
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname="gw.test"
            )
            for _ in range(100):
                if buffers:
                    break
                await asyncio.sleep(0.01)
            writer.close()
    finally:
        sslproto.SSLProtocol.max_size = default
    assert buffers == [TLS_READ_BUFFER_BYTES] and TLS_READ_BUFFER_BYTES <= 64 * 1024 < default


def test_the_gateway_raises_a_low_open_file_limit_toward_its_connection_limit() -> None:
    # Run in a child: the limit belongs to the process. A soft limit of 1,024 (a common service
    # default) would cap the gateway near a thousand collectors.
    script = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from gateway.server import raise_fd_limit\n"
        "wanted = 2048 if hard == resource.RLIM_INFINITY else min(2048, hard)\n"
        "assert raise_fd_limit(2048) == wanted, raise_fd_limit(2048)\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
