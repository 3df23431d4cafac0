"""A loopback TCP forwarder whose live connections a test can cut, to break sockets mid-flight.

It forwards raw bytes, so TLS passes through untouched (the client still
verifies the real server's certificate).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

from common.embedded.process import free_port

# What a rate-limited link holds in flight from its upstream (kernel receive buffer and reader).
SLOW_LINK_BUFFER = 32 * 1024


class CuttableProxy:
    """``rate``: at most this many bytes a second from the upstream to each client (a slow link)."""

    def __init__(self, upstream_port: int, rate: float | None = None) -> None:
        self.upstream_port = upstream_port
        self.rate = rate
        self.relayed = 0  # bytes from the upstream to clients
        self.port = free_port()
        self.accepted = 0
        self.refusing = False  # while set, new connections are reset at once (a link that is down)
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.refusing:
            client_w.transport.abort()
            return
        self.accepted += 1
        try:
            upstream_r, upstream_w = await self._connect_upstream()
        except OSError:
            client_w.close()
            return
        pair = {client_w, upstream_w}
        self._writers |= pair
        await asyncio.gather(self._copy(client_r, upstream_w), self._copy(upstream_r, client_w, down=True))
        self._writers -= pair

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A slow link buffers little: without a small receive buffer the upstream pushes megabytes
        into this side's kernel buffer at loopback speed, which the link then relays after the
        upstream died (a gateway killed "mid-artifact" then still delivered all of it)."""
        if not self.rate:
            return await asyncio.open_connection("127.0.0.1", self.upstream_port)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_LINK_BUFFER)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.upstream_port))
        except OSError:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock, limit=SLOW_LINK_BUFFER)

    async def _copy(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, down: bool = False
    ) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            while data := await reader.read(16384 if down and self.rate else 65536):
                writer.write(data)
                await writer.drain()
                if down:
                    self.relayed += len(data)
                    if self.rate:
                        await asyncio.sleep(len(data) / self.rate)
        writer.close()

    async def _abort_all(self) -> int:
        writers = list(self._writers)
        for writer in writers:
            writer.transport.abort()
        return len(writers) // 2

    def cut(self) -> int:
        """Abort every live connection (both legs, without a clean close); returns how many."""
        return asyncio.run_coroutine_threadsafe(self._abort_all(), self._loop).result(10)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self.cut()
        asyncio.run_coroutine_threadsafe(self._server.wait_closed(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
