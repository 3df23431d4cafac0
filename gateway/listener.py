"""The gateway's own accept loop: admission before TLS, then uvicorn's protocol (docs/gateway.md,
"Storms").

asyncio's server starts a TLS handshake for every connection it accepts, as fast as the kernel
hands them over, and the protocol it builds learns of the connection only once the handshake is
done — too late to refuse it cheaply. :class:`Listener` takes connections from the listening
socket itself, asks :class:`gateway.admission.Admission` whether to start, hold or shed each,
and runs the TLS handshake (``loop.connect_accepted_socket``) only for those it starts; the
protocol is uvicorn's, built by the same factory uvicorn would use. :class:`AdmittingServer` is
uvicorn's server with these listeners in place of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import struct
import time
from collections.abc import Callable

from common.runtime import sd_notify
from common.runtime.draining_server import DrainingServer
from common.telemetry.logs import get_logger
from gateway.admission import START, Admission, AdmissionLimits, Shed
from gateway.metrics import (
    EDGE_REFUSALS,
    HANDSHAKE_BUDGET,
    HANDSHAKES,
    HANDSHAKES_IN_PROGRESS,
    HANDSHAKES_WAITING,
    LOOP_LAG,
)

log = get_logger("versus.gateway.listener")

# accept() errors that mean the process (or the machine) is out of descriptors or memory: asyncio's
# own server waits a second before accepting again, rather than spinning on the error.
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_RETRY_DELAY_S = 1.0
# struct linger {l_onoff = 1, l_linger = 0}: close() sends a reset.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)
# How often the event loop's lateness is sampled for the handshake budget (gateway/admission.py).
LAG_SAMPLE_S = 0.1


class Listener:
    """Accepts on one listening socket within :class:`Admission`'s bounds.

    Offers ``close()`` and ``wait_closed()`` as :class:`asyncio.Server` does, so uvicorn's
    shutdown stops it with its own servers.
    """

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None,
        admission: Admission[socket.socket],
        connections: Callable[[], int],
        handshake_timeout_s: float,
        *,
        watch_loop: bool = False,
    ) -> None:
        """``watch_loop``: this listener samples the event loop's lateness for the budget its
        admission shares with the process's other listeners (one of them does)."""
        self.sock = sock
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._admission = admission
        self._connections = connections
        self._timeout_s = handshake_timeout_s
        self._handshakes: set[asyncio.Task[None]] = set()
        self._accepting: asyncio.Task[None] | None = None
        self._watch_loop = watch_loop
        self._watching: asyncio.Task[None] | None = None

    def start(self) -> Listener:
        self.sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._accepting = loop.create_task(self._accept_loop())
        if self._watch_loop:
            self._watching = loop.create_task(self._watch())
        return self

    def close(self) -> None:
        """Stop accepting; handshakes in progress are abandoned and waiting connections closed."""
        if self._accepting is not None:
            self._accepting.cancel()
        if self._watching is not None:
            self._watching.cancel()
        for task in list(self._handshakes):
            task.cancel()
        for conn in self._admission.drain():
            conn.close()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accepting, self._watching, *self._handshakes) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept_loop(self) -> None:
        # Accepts whatever the kernel has, always: a full listen queue makes the kernel drop the
        # client's packets, and TCP's retransmission timers would then stretch its handshake.
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRORS:
                    log.warning("accept failed; pausing", error=exc.strerror, pause_s=ACCEPT_RETRY_DELAY_S)
                    await asyncio.sleep(ACCEPT_RETRY_DELAY_S)
                continue  # ECONNABORTED and the like: that peer is gone already
            verdict = self._admission.arrive(conn, self._connections(), time.monotonic())
            if verdict == START:
                self._start(conn)
            elif isinstance(verdict, Shed):
                _shed(conn, verdict)
            HANDSHAKES_WAITING.set(self._admission.waiting)

    async def _watch(self) -> None:
        """Sample how late the loop runs a timer; the budget follows (fewer handshakes while late),
        and connections waiting for a slot start as it grows back."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(LAG_SAMPLE_S)
            lag = max(0.0, loop.time() - asked - LAG_SAMPLE_S)
            LOOP_LAG.set(lag)
            started, stale = self._admission.observe(lag, time.monotonic())
            HANDSHAKE_BUDGET.set(self._admission.budget.limit)
            for waited in stale:
                _shed(waited, Shed.WAITED_TOO_LONG)
            for conn in started:
                self._start(conn)
            HANDSHAKES_WAITING.set(self._admission.waiting)

    def _start(self, conn: socket.socket) -> None:
        HANDSHAKES_IN_PROGRESS.inc()
        task = asyncio.get_running_loop().create_task(self._handshake(conn))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self._ssl is None:
                await loop.connect_accepted_socket(self._factory, conn)
            else:
                await loop.connect_accepted_socket(
                    self._factory, conn, ssl=self._ssl, ssl_handshake_timeout=self._timeout_s
                )
        except (OSError, ssl.SSLError, EOFError):
            # A failed or timed-out handshake (ConnectionAbortedError), or a peer that left:
            # asyncio closed the transport; nothing reached the app.
            HANDSHAKES.labels("failed").inc()
            conn.close()
        except asyncio.CancelledError:
            conn.close()
            raise
        else:
            HANDSHAKES.labels("done").inc()
        finally:
            HANDSHAKES_IN_PROGRESS.dec()
            if not self._closing():
                following, stale = self._admission.ended(time.monotonic())
                for waited in stale:
                    _shed(waited, Shed.WAITED_TOO_LONG)
                if following is not None:
                    self._start(following)
                HANDSHAKES_WAITING.set(self._admission.waiting)

    def _closing(self) -> bool:
        return self._accepting is None or self._accepting.done()


def _shed(conn: socket.socket, reason: Shed) -> None:
    """Close ``conn`` before a byte of TLS, with a reset (no TIME_WAIT left per shed peer)."""
    EDGE_REFUSALS.labels(f"{reason.value}_before_tls").inc()
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
    conn.close()


class AdmittingServer(DrainingServer):
    """uvicorn's server (draining as :class:`DrainingServer`) accepting through :class:`Listener`.

    uvicorn is given no socket and no TLS context of its own; the listeners take its place in
    ``self.servers``, so its shutdown closes them first, as it would close its own.
    """

    def __init__(
        self,
        config: object,
        drain_s: float,
        ssl_context: ssl.SSLContext | None,
        limits: AdmissionLimits,
        handshake_timeout_s: float,
    ) -> None:
        super().__init__(config, drain_s)  # type: ignore[arg-type]
        self.admission: Admission[socket.socket] = Admission(limits)
        self._ssl_context = ssl_context
        self._handshake_timeout_s = handshake_timeout_s

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn's startup (lifespan, state) with no listener of its own.
        await super(DrainingServer, self).startup([])
        if not self.started:
            return
        config = self.config

        def protocol() -> asyncio.Protocol:
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )
            return made

        for index, sock in enumerate(sockets or []):
            listener = Listener(
                sock,
                protocol,
                self._ssl_context,
                self.admission,
                lambda: len(self.server_state.connections),
                self._handshake_timeout_s,
                watch_loop=index == 0,
            )
            self.servers.append(listener.start())  # type: ignore[arg-type]
        sd_notify.ready()
