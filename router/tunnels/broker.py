"""Tunnel sessions as the router brokers them: offered to a collector, held by a gateway.

The router decides (placement, tenant scope, RBAC, audit: router/tunnels/service.py), then
records the session in Redis with the SHA-256 of a fresh attach ticket and offers it on the
collector's next claim (waking a held claim at once). The collector dials back a gateway; that
gateway takes the session, completes the record with its attach address (or the reason the
session failed, such as ``target_unreachable``) and wakes this router, which is listening on the
session's wake-up key from before the offer went out. The bytes never cross the router when the
platform attaches directly (docs/gateway.md, "Tunnels").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from dataclasses import dataclass

from redis.asyncio import Redis

from common.redis.fanout import KeyedFanout
from common.redis.keys import TUNNEL, WORK, tunnel_wake_key, wake_channel
from common.telemetry import tracing
from common.telemetry.logs import get_logger
from common.tunnel.record import Record, new_ticket

OFFER_WAIT_S = 30.0
_OFFERS = "versus:offers:"
# How long a session's record outlives the offer's wait (a dial-back in flight at the end).
RECORD_GRACE_S = 30
# How often the record is read while waiting, should a wake-up be missed (Redis reconnecting).
_POLL_S = 1.0

log = get_logger("versus.router.tunnels")


@dataclass(frozen=True, slots=True)
class Offered:
    """A session offered to a collector: its id, and the attach ticket only its opener learns."""

    session_id: str
    collector_id: str
    ticket: str


def _prepare(collector_id: str, direct: bool) -> tuple[Offered, Record]:
    session_id = f"tun-{secrets.token_hex(12)}"
    ticket, digest = new_ticket(session_id)
    record = Record(
        collector_id=collector_id, ticket_sha256=digest, direct=direct,
        traceparent=tracing.current_traceparent(),
    )  # fmt: skip
    return Offered(session_id, collector_id, ticket), record


class TunnelHub:
    """Offers sessions to collectors and waits for the gateway that takes each one."""

    def __init__(self, redis: Redis, wakes: KeyedFanout):
        self.redis = redis
        self.wakes = wakes

    async def open(
        self, collector_id: str, host: str, port: int, direct: bool
    ) -> tuple[Offered, Record | None]:
        """Offer a session and wait for a gateway to take it: the record it completed (held, or
        failed with a reason), or None when no collector dialled back within :data:`OFFER_WAIT_S`
        (the record is then gone: a late dial-back is refused)."""
        offered, record = _prepare(collector_id, direct)
        # Listening before the offer goes out: the gateway may take it at once.
        async with self.wakes.listening(tunnel_wake_key(offered.session_id)) as woken:
            await self._publish(offered, record, host, port)
            held = await self._wait_taken(offered.session_id, woken)
        if held is None or held.failed:
            await self.forget(offered.session_id)
        return offered, held

    async def offer(self, collector_id: str, host: str, port: int, direct: bool = False) -> Offered:
        """Offer a session without waiting for it to be taken."""
        offered, record = _prepare(collector_id, direct)
        await self._publish(offered, record, host, port)
        return offered

    async def _publish(self, offered: Offered, record: Record, host: str, port: int) -> None:
        session_id, collector_id = offered.session_id, offered.collector_id
        offer = json.dumps({"type": "tunnel", "session_id": session_id, "host": host, "port": port})
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(TUNNEL + session_id, record.to_json(), ex=int(OFFER_WAIT_S + RECORD_GRACE_S))
        pipe.rpush(_OFFERS + collector_id, offer)
        pipe.expire(_OFFERS + collector_id, int(OFFER_WAIT_S))
        pipe.publish(wake_channel(collector_id), WORK)
        await pipe.execute()
        log.info("tunnel offered", session_id=session_id, collector_id=collector_id, direct=record.direct)

    async def _wait_taken(self, session_id: str, woken: asyncio.Event) -> Record | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + OFFER_WAIT_S
        while True:
            woken.clear()
            raw = await self.redis.get(TUNNEL + session_id)
            record = Record.from_json(raw) if raw else None
            if record is not None and (record.gateway or record.failed):
                return record
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(_POLL_S, remaining)):
                    await woken.wait()

    async def take_offers(self, collector_id: str) -> list[dict[str, object]]:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(_OFFERS + collector_id, 0, -1)
        pipe.delete(_OFFERS + collector_id)
        raw, _ = await pipe.execute()
        return [json.loads(item) for item in raw]

    async def has_offers(self, collector_id: str) -> bool:
        return bool(await self.redis.exists(_OFFERS + collector_id))

    async def forget(self, session_id: str) -> None:
        """Drop a session's record (best effort: it expires anyway)."""
        try:
            await self.redis.delete(TUNNEL + session_id)
        except Exception:
            log.warning("tunnel record not deleted; it expires shortly", session_id=session_id)
