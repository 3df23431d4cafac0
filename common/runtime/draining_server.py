"""The HTTPS services' uvicorn server: it tells systemd when it serves, and stops gracefully in an
order a load balancer can follow - readiness goes first, the listener after.

On the first SIGTERM or SIGINT the gateway (or the console) answers ``/readyz`` with 503
``draining`` for ``VERSUS_GATEWAY_DRAIN_S`` seconds while it still serves
everything else: the balancer's health checks take the gateway out of rotation,
so new long-polls and sockets go to the other gateways, before uvicorn closes
the listener and winds down what is left within ``shutdown_grace_s`` (held
claims end, WebSockets close with 1012 "service restart" and their collectors
reconnect through the balancer). A second signal stops at once.
"""

from __future__ import annotations

import socket
import time
from types import FrameType

import uvicorn

from common.runtime import sd_notify
from common.telemetry.logs import get_logger

log = get_logger("versus.http")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_s: float):
        super().__init__(config)
        self.drain_s = drain_s
        self.draining_since: float | None = None

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            sd_notify.ready()  # the deploy/ units are Type=notify

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_s > 0 and self.draining_since is None and not self.should_exit:
            # A signal handler: only note the time; on_tick, on the event loop, acts on it.
            self.draining_since = time.monotonic()
            self._captured_signals.append(sig)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        since = self.draining_since
        if since is not None and not self.should_exit:
            if counter % 10 == 0:
                log.info("draining", left_s=round(max(0.0, since + self.drain_s - time.monotonic()), 1))
            if time.monotonic() >= since + self.drain_s:
                sd_notify.stopping()
                self.should_exit = True
        return await super().on_tick(counter)
