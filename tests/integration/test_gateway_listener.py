"""The gateway's listener on real sockets with real TLS (gateway/listener.py): handshakes beyond the
bound wait in the kernel's queue instead of starting, a stalled handshake frees its place at the
timeout, a connection over the connection limit is closed before any TLS, and shutdown abandons
handshakes in progress. uvicorn serves a trivial app through :class:`AdmittingServer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from common.trust.tls import ensure_gateway_tls
from gateway.admission import AdmissionLimits
from gateway.listener import AdmittingServer
from gateway.metrics import EDGE_REFUSALS, HANDSHAKES
from gateway.server import WS_OPTIONS, bind

pytestmark = pytest.mark.timeout(60)


async def _app(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    assert scope["scheme"] == "https"  # uvicorn sees the TLS transport the listener made
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@dataclass
class Served:
    server: AdmittingServer
    port: int
    client_tls: ssl.SSLContext

    async def stalled(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection that never starts its TLS handshake."""
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def get(self, within_s: float = 5.0) -> bytes:
        """One HTTPS request on a new connection; the response."""
        async with asyncio.timeout(within_s):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", self.port, ssl=self.client_tls, server_hostname="localhost"
            )
            try:
                writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                return await reader.read()
            finally:
                writer.close()


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, limits: AdmissionLimits, handshake_timeout_s: float = 10.0
) -> AsyncIterator[Served]:
    tls = ensure_gateway_tls(tmp_path / "tls", "localhost", [])
    config = uvicorn.Config(_app, log_config=None, lifespan="on", **WS_OPTIONS)
    config.load()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tls.cert_file, tls.key_file)
    client_tls = ssl.create_default_context(cafile=str(tls.ca_file))
    sock = bind("127.0.0.1", 0)
    server = AdmittingServer(config, 0, server_tls, limits, handshake_timeout_s)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes only this flag
        await asyncio.sleep(0.01)
    try:
        yield Served(server, sock.getsockname()[1], client_tls)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def _count(metric: Any, label: str) -> float:
    return float(metric.labels(label)._value.get())


async def test_handshakes_beyond_the_bound_wait_until_one_ends(tmp_path: Path) -> None:
    async with serving(tmp_path, AdmissionLimits(max_handshakes=2)) as served:
        first, second = await served.stalled(), await served.stalled()
        await asyncio.sleep(0.2)
        assert served.server.admission.handshaking == 2
        waiting = asyncio.create_task(served.get(within_s=20))
        await asyncio.sleep(1.0)
        # Accepted and held: its hello waits in the socket, no handshake started for it.
        assert not waiting.done()
        assert (served.server.admission.handshaking, served.server.admission.waiting) == (2, 1)
        first[1].close()  # a stalled peer leaves: its place goes to the waiting one
        assert (await waiting).endswith(b"ok")
        second[1].close()


async def test_a_stalled_handshake_frees_its_place_at_the_timeout(tmp_path: Path) -> None:
    failed = _count(HANDSHAKES, "failed")
    async with serving(tmp_path, AdmissionLimits(max_handshakes=1), handshake_timeout_s=0.5) as served:
        stalled = await served.stalled()
        await asyncio.sleep(0.1)
        started = time.monotonic()
        assert (await served.get(within_s=10)).endswith(b"ok")
        assert time.monotonic() - started >= 0.3  # it waited for the stalled one's timeout
        assert await asyncio.wait_for(stalled[0].read(), 5) == b""  # the stalled peer was closed
        assert _count(HANDSHAKES, "failed") == failed + 1
        stalled[1].close()


async def _reset_before_tls(served: Served) -> None:
    """A new connection is ended at once, without a byte of TLS (a reset; a handshake would wait
    10 s for a hello, a waiting connection would wait for a slot)."""
    reader, writer = await served.stalled()
    try:
        said = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        said = b""
    assert said == b""
    writer.close()


async def test_a_full_waiting_line_sheds_before_tls(tmp_path: Path) -> None:
    shed = _count(EDGE_REFUSALS, "handshake_line_full_before_tls")
    async with serving(tmp_path, AdmissionLimits(max_handshakes=1, max_waiting=1)) as served:
        stalled = [await served.stalled(), await served.stalled()]  # one handshaking, one waiting
        await asyncio.sleep(0.2)
        await _reset_before_tls(served)
        assert _count(EDGE_REFUSALS, "handshake_line_full_before_tls") == shed + 1
        for _, writer in stalled:
            writer.close()


async def test_a_connection_that_waited_too_long_is_shed_not_started(tmp_path: Path) -> None:
    shed = _count(EDGE_REFUSALS, "handshake_wait_too_long_before_tls")
    limits = AdmissionLimits(max_handshakes=1, max_wait_s=0.3)
    async with serving(tmp_path, limits, handshake_timeout_s=1.0) as served:
        stalled = await served.stalled()  # holds the only slot for its 1 s handshake timeout
        await asyncio.sleep(0.1)
        late = asyncio.create_task(served.get(within_s=10))
        # When the slot frees at ~1 s, the waiting one has waited ~0.9 s: shed, not started.
        with pytest.raises((ConnectionResetError, ssl.SSLError)):
            await late
        assert _count(EDGE_REFUSALS, "handshake_wait_too_long_before_tls") == shed + 1
        stalled[1].close()
        assert (await served.get()).endswith(b"ok")  # the next one is served at once


async def test_over_the_connection_limit_a_connection_is_closed_before_tls(tmp_path: Path) -> None:
    shed = _count(EDGE_REFUSALS, "connection_limit_before_tls")
    async with serving(tmp_path, AdmissionLimits(max_connections=1)) as served:
        # One connection holds the only place (TLS done, kept open by keep-alive).
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", served.port, ssl=served.client_tls, server_hostname="localhost"
        )
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        await _reset_before_tls(served)
        assert _count(EDGE_REFUSALS, "connection_limit_before_tls") == shed + 1
        writer.close()
        await writer.wait_closed()
        for _ in range(50):  # the server notices the close
            if not served.server.server_state.connections:
                break
            await asyncio.sleep(0.05)
        assert (await served.get()).endswith(b"ok")


async def test_shutdown_abandons_handshakes_in_progress_and_waiting(tmp_path: Path) -> None:
    async with serving(tmp_path, AdmissionLimits(max_handshakes=2)) as served:
        peers = [await served.stalled() for _ in range(3)]
        await asyncio.sleep(0.2)
        assert (served.server.admission.handshaking, served.server.admission.waiting) == (2, 1)
        started = time.monotonic()
    # The context ended the server: within its grace, not at the 10 s handshake timeout.
    assert time.monotonic() - started < 5
    for reader, writer in peers:
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_a_late_loop_runs_fewer_handshakes_until_it_keeps_time_again(tmp_path: Path) -> None:
    # Under overload the loop that starts handshakes is the one that answers admitted collectors'
    # claims: while it runs late, new connections wait instead of taking its time.
    async with serving(tmp_path, AdmissionLimits(max_handshakes=64)) as served:
        admission = served.server.admission
        loop = asyncio.get_running_loop()
        late = True

        def hold_the_loop() -> None:  # as a flood of handshakes and frames would
            if late:
                time.sleep(0.2)
                loop.call_later(0.05, hold_the_loop)

        loop.call_soon(hold_the_loop)
        async with asyncio.timeout(10):
            while admission.budget.limit > 4:  # noqa: ASYNC110 - the budget signals nothing
                await asyncio.sleep(0.1)
        stalled = [await served.stalled() for _ in range(10)]
        await asyncio.sleep(0.5)
        assert (admission.handshaking, admission.waiting) == (4, 6)
        late = False
        # On time again: a sixteenth of the bound comes back per sample, and the line starts.
        async with asyncio.timeout(10):
            while admission.handshaking < 10:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert (admission.handshaking, admission.waiting) == (10, 0)
        for _, writer in stalled:
            writer.close()
