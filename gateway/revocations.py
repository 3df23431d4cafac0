"""Revocation broadcast: open sockets of a revoked collector close at once, on every gateway.

The router publishes the collector id on one Redis channel when an operator
revokes it; each gateway process listens and wakes the standing check of that
collector's open control and tunnel sockets, which then re-read the status
from PostgreSQL (the source of truth) and close with 4401. A slow periodic
check (``revocation_check_s``, 60 s by default) remains as the safety net for
a lost message or a certificate that simply expires.
"""

from __future__ import annotations

import asyncio
import contextlib

from redis.asyncio import Redis

from common.redis.fanout import CallbackWake, Fanout, text
from common.redis.revocations import CHANNEL


class RevocationFeed(Fanout):
    """The broadcast, fanned out to the open sockets of each collector (``watch``)."""

    def __init__(self, redis: Redis):
        super().__init__(redis, channel=CHANNEL, key_of=lambda m: text(m["data"]))

    def watch(self, collector_id: str) -> contextlib.AbstractContextManager[asyncio.Event]:
        """An event set when ``collector_id`` is announced revoked while the socket is open."""
        return self.listener(collector_id)

    def register(self, collector_id: str, wake: CallbackWake) -> None:
        """Call ``wake``'s callback whenever ``collector_id`` is announced revoked, until
        :meth:`unregister` (a socket with no task of its own: gateway/control_ws.py)."""
        self.add(collector_id, wake)

    def unregister(self, collector_id: str, wake: CallbackWake) -> None:
        self.discard(collector_id, wake)
