"""The gateway's listening socket: TCP_NODELAY on accepted connections, one shared TLS read buffer,
the open-file limit."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.embedded.process import free_port
from common.trust.tls import ensure_gateway_tls
from gateway.server import bind
from gateway.tls_buffer import TLS_READ_BUFFER_BYTES, SharedReadBufferSSLProtocol, share_tls_read_buffer


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


async def test_tls_connections_read_through_one_shared_buffer_and_keep_their_own_bytes(
    tmp_path: Path,
) -> None:
    # asyncio gives each TLS connection its own read buffer (256 KiB by default): a third of a
    # parked collector's memory in the gateway. Every connection now reads through one buffer;
    # 40 connections sending different bytes at once must each get back exactly their own.
    from asyncio import sslproto

    tls = ensure_gateway_tls(tmp_path, "gw.test", [])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tls.cert_file, tls.key_file)
    client_ctx = ssl.create_default_context(cafile=str(tls.ca_file))
    buffers: list[Any] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_protocol: Any = writer.transport._ssl_protocol  # type: ignore[attr-defined]
        buffers.append(ssl_protocol.get_buffer(-1))
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def one(port: int, seed: int) -> bool:
        payload = random.Random(seed).randbytes(300_000)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="gw.test"
        )

        async def send() -> None:
            for start in range(0, len(payload), 7_000):
                writer.write(payload[start : start + 7_000])
                await writer.drain()

        sending = asyncio.create_task(send())
        received = await reader.readexactly(len(payload))
        await sending
        writer.close()
        return received == payload

    original = sslproto.SSLProtocol
    try:
        share_tls_read_buffer()
        share_tls_read_buffer()  # idempotent
        assert sslproto.SSLProtocol is SharedReadBufferSSLProtocol
        server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
        async with server:
            port = server.sockets[0].getsockname()[1]
            results = await asyncio.gather(*(one(port, seed) for seed in range(40)))
    finally:
        sslproto.SSLProtocol = original  # type: ignore[misc]
    assert all(results)
    assert len(buffers) == 40
    # One buffer for all of them, of the stated size; the standard class's own per-connection
    # buffer is not kept (a Python release renaming its attributes would fail here).
    assert all(b is SharedReadBufferSSLProtocol._shared_view for b in buffers)
    assert len(SharedReadBufferSSLProtocol._shared) == TLS_READ_BUFFER_BYTES <= 64 * 1024
    probe = object.__new__(SharedReadBufferSSLProtocol)
    probe._ssl_buffer = bytearray(10)
    assert "_ssl_buffer" not in vars(probe) and probe._ssl_buffer is SharedReadBufferSSLProtocol._shared


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
