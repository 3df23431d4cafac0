"""The gateway's listening socket: accepted connections must get TCP_NODELAY from asyncio."""

from __future__ import annotations

import asyncio
import socket

from common.embedded.process import free_port
from gateway.server import bind


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
