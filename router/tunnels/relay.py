"""Tunnel sessions: a platform's byte stream paired with a collector's dial-back, relayed through the gateway.

The platform opens ``TunnelService/OpenTunnel`` on a router; the router picks
the collector, records the session in Redis and offers it on the collector's
next claim (waking a held claim at once). The collector dials back the
gateway's ``/tunnel`` socket; the gateway opens ``RelayTunnel`` to the router
that holds the session (its address is in the session record) and the router
pairs the two streams in memory. Each direction is a bounded queue, so a slow
reader slows the writer instead of growing a buffer; either side can
half-close its direction; a session ends when both directions are closed, when
either side goes away, after an idle period or at its maximum length.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from versus.router.v1 import tunnel_pb2 as pb
from versus.router.v1 import tunnel_pb2_grpc

from common.access import rbac
from common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from common.grpc.server import Context
from common.redis.keys import WORK, wake_channel
from common.telemetry.logs import get_logger

OFFER_WAIT_S = 30.0
IDLE_TIMEOUT_S = 300.0
MAX_SESSION_S = 8 * 3600.0
QUEUE_CHUNKS = 32
MAX_CHUNK_BYTES = 64 * 1024
_SESSION = "versus:tunnel:"
_OFFERS = "versus:offers:"

log = get_logger("versus.router.tunnels")

# How long a session's Redis record outlives the offer's wait (a dial-back in flight at the end).
RECORD_GRACE_S = 30
# Reasons a collector may end a session with (RelayTunnelRequest.failed); anything else is collector_gone.
FAILURE_REASONS = frozenset({"target_unreachable"})

# None in a queue means: this direction is closed (half-close).
Chunk = bytes | None


@dataclass
class Session:
    session_id: str
    collector_id: str
    to_collector: asyncio.Queue[Chunk] = field(default_factory=lambda: asyncio.Queue(QUEUE_CHUNKS))
    to_platform: asyncio.Queue[Chunk] = field(default_factory=lambda: asyncio.Queue(QUEUE_CHUNKS))
    paired: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    eof_from: set[str] = field(default_factory=set)  # sides that half-closed: "platform", "collector"
    started: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)

    def close(self, reason: str) -> None:
        if not self.closed.is_set():
            self.reason = reason
            self.closed.set()

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def deadline(self) -> float:
        return min(self.last_activity + IDLE_TIMEOUT_S, self.started + MAX_SESSION_S)


class TunnelHub:
    """The sessions this router process holds."""

    def __init__(self, redis: Redis, advertise_address: str):
        self.redis = redis
        self.advertise_address = advertise_address
        self.sessions: dict[str, Session] = {}

    async def offer(self, collector_id: str, host: str, port: int) -> Session:
        session = Session(f"tun-{secrets.token_hex(12)}", collector_id)
        self.sessions[session.session_id] = session
        record = {"collector_id": collector_id, "router": self.advertise_address}
        offer = json.dumps({"type": "tunnel", "session_id": session.session_id, "host": host, "port": port})
        pipe = self.redis.pipeline(transaction=True)
        # The record is read once, by the gateway at the dial-back: it need not outlive the offer.
        pipe.set(_SESSION + session.session_id, json.dumps(record), ex=int(OFFER_WAIT_S + RECORD_GRACE_S))
        pipe.rpush(_OFFERS + collector_id, offer)
        pipe.expire(_OFFERS + collector_id, int(OFFER_WAIT_S))
        pipe.publish(wake_channel(collector_id), WORK)
        await pipe.execute()
        return session

    async def take_offers(self, collector_id: str) -> list[dict[str, object]]:
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(_OFFERS + collector_id, 0, -1)
        pipe.delete(_OFFERS + collector_id)
        raw, _ = await pipe.execute()
        return [json.loads(item) for item in raw]

    async def has_offers(self, collector_id: str) -> bool:
        return bool(await self.redis.exists(_OFFERS + collector_id))

    async def forget(self, session: Session) -> None:
        """The session ended: drop it here and its Redis record (best effort; the record expires)."""
        self.sessions.pop(session.session_id, None)
        try:
            await self.redis.delete(_SESSION + session.session_id)
        except Exception:
            log.warning("tunnel record not deleted; it expires shortly", session_id=session.session_id)


async def _pump_in(
    requests: AsyncIterator[object], queue: asyncio.Queue[Chunk], session: Session, side: str
) -> None:
    """Copy one side's data into the other side's queue (awaiting space: backpressure).

    A stream that ends without a half-close means that side went away: the
    whole session is closed with ``<side>_gone`` as the reason.
    """
    try:
        async for request in requests:
            kind = request.WhichOneof("msg")  # type: ignore[attr-defined]
            if kind == "data":
                data: bytes = request.data  # type: ignore[attr-defined]
                if len(data) > MAX_CHUNK_BYTES:
                    session.close("chunk_too_large")
                    return
                session.touch()
                await queue.put(data)
            elif kind == "close_write":
                session.eof_from.add(side)
                await queue.put(None)
                return
            elif kind == "failed":
                reason: str = request.failed  # type: ignore[attr-defined]
                session.close(reason if reason in FAILURE_REASONS else "collector_gone")
                return
    except Exception as exc:  # the stream broke
        log.info("tunnel stream ended", session_id=session.session_id, reason=type(exc).__name__)
    session.close(f"{side}_gone")


async def _settle(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` unless it is done, and wait until it is: no task is left pending behind."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def _both_done(reader: asyncio.Task[None], session: Session) -> None:
    """Wait for the other direction to finish, unless the session closes first."""
    closed = asyncio.ensure_future(session.closed.wait())
    try:
        await asyncio.wait([reader, closed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _settle(closed)
        if not reader.done():
            await _settle(reader)


async def _drain(queue: asyncio.Queue[Chunk], session: Session) -> AsyncGenerator[Chunk, None]:
    """Chunks from ``queue`` until its direction closes, the session closes, or a timeout passes."""
    while True:
        if session.closed.is_set():
            # Deliver what already arrived before the session closed, then stop.
            while not queue.empty():
                chunk = queue.get_nowait()
                yield chunk
                if chunk is None:
                    return
            return
        remaining = session.deadline() - time.monotonic()
        if remaining <= 0:
            session.close(
                "idle_timeout" if session.last_activity + IDLE_TIMEOUT_S <= time.monotonic() else "max_age"
            )
            return
        getter = asyncio.ensure_future(queue.get())
        closer = asyncio.ensure_future(session.closed.wait())
        try:
            await asyncio.wait([getter, closer], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await _settle(closer)
            if not getter.done():
                await _settle(getter)
        if getter.cancelled():
            continue
        chunk = getter.result()
        session.touch()
        yield chunk
        if chunk is None:
            return


# (collector_id, site_id, tenant_id, may_see_tenant) -> the collector that will carry the tunnel.
PickCollector = Callable[[str, str, str, Callable[[str], bool]], Awaitable[str]]


class TunnelServicer(tunnel_pb2_grpc.TunnelServiceServicer):
    def __init__(self, hub: TunnelHub, pick_collector: PickCollector):
        self.hub = hub
        self.pick_collector = pick_collector

    async def OpenTunnel(
        self, request_iterator: AsyncIterator[pb.OpenTunnelRequest], context: Context
    ) -> AsyncIterator[pb.OpenTunnelResponse]:
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("msg") != "open":
            raise InvalidArgument("the first message must be `open`", code="tunnel_open_missing")
        target = first.open
        if not target.host or len(target.host) > 255 or not 0 < target.port < 65536:
            raise InvalidArgument("host and a port in 1-65535 are required", code="tunnel_target_invalid")
        if target.tenant_id:
            rbac.require_tenant(target.tenant_id)
        collector_id = await self.pick_collector(
            target.collector_id, target.site_id, target.tenant_id, rbac.sees_tenant
        )
        session = await self.hub.offer(collector_id, target.host, target.port)
        log.info("tunnel offered", session_id=session.session_id, collector_id=collector_id)
        reader: asyncio.Task[None] | None = None
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OFFER_WAIT_S):
                    await session.paired.wait()
            if not session.paired.is_set():
                yield pb.OpenTunnelResponse(closed=pb.TunnelClosed(reason="collector_did_not_connect"))
                return
            yield pb.OpenTunnelResponse(
                ready=pb.TunnelReady(session_id=session.session_id, collector_id=collector_id)
            )
            reader = asyncio.create_task(
                _pump_in(request_iterator, session.to_collector, session, "platform")
            )
            async with contextlib.aclosing(_drain(session.to_platform, session)) as chunks:
                async for chunk in chunks:
                    if chunk is None:
                        yield pb.OpenTunnelResponse(close_write=True)
                    else:
                        yield pb.OpenTunnelResponse(data=chunk)
            await _both_done(reader, session)
            yield pb.OpenTunnelResponse(closed=pb.TunnelClosed(reason=session.reason or "done"))
        finally:
            session.close(session.reason or "platform_gone")
            if reader is not None:
                await _settle(reader)
            await self.hub.forget(session)

    async def RelayTunnel(
        self, request_iterator: AsyncIterator[pb.RelayTunnelRequest], context: Context
    ) -> AsyncIterator[pb.RelayTunnelResponse]:
        first = await anext(request_iterator, None)
        if first is None or first.WhichOneof("msg") != "hello":
            raise InvalidArgument("the first message must be `hello`", code="tunnel_hello_missing")
        session = self.hub.sessions.get(first.hello.session_id)
        if session is None or session.closed.is_set():
            raise FailedPrecondition(
                "no such open tunnel session on this router", code="tunnel_session_unknown"
            )
        if session.collector_id != first.hello.collector_id or session.paired.is_set():
            raise PermissionDenied("this tunnel session was not offered to you", code="tunnel_not_yours")
        session.paired.set()
        reader = asyncio.create_task(_pump_in(request_iterator, session.to_platform, session, "collector"))
        finished = sent_eof = False
        try:
            async with contextlib.aclosing(_drain(session.to_collector, session)) as chunks:
                async for chunk in chunks:
                    if chunk is None:
                        sent_eof = True
                        yield pb.RelayTunnelResponse(close_write=True)
                    else:
                        yield pb.RelayTunnelResponse(data=chunk)
            await _both_done(reader, session)
            finished = True
        finally:
            await _settle(reader)
            # Both directions done before the stream ended: the collector hanging up
            # now is the normal end, not the collector going away.
            if not finished and not (sent_eof and "collector" in session.eof_from):
                session.close(session.reason or "collector_gone")
