"""The tunnel sessions this gateway holds, from the collector's first dial-back to their end.

A session is taken by the gateway that receives the collector's first dial-back (exactly one:
a ``SET NX`` of its holder key decides). Once the first leg is open, the gateway completes the
session's record with its attach address and wakes the router waiting in ``OpenTunnel``, which
hands the platform (or itself, for callers that did not ask for direct attachment) a ticket to
attach here. Later dial-backs of the same session resume it on this gateway; one that lands on
another gateway finds the holder key taken and is refused with ``gateway_gone``.

Each session has a supervisor that ends it when its platform end does not attach in time, when
its collector does not come back within the resume window, when it is idle too long, or at its
maximum age; and then forgets it here and in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from common.errors import FailedPrecondition, PermissionDenied
from common.redis.keys import TUNNEL, TUNNEL_HOLDER, tunnel_wake_key, wake_channel
from common.telemetry import tracing
from common.telemetry.logs import get_logger
from common.tunnel import frames
from common.tunnel.end import RESUME_WINDOW_S, TunnelEnd
from common.tunnel.record import TICKET_TTL_S, Record
from gateway.metrics import TUNNEL_BYTES, TUNNEL_ENDS, TUNNEL_SESSIONS

IDLE_TIMEOUT_S = 300.0
MAX_SESSION_S = 8 * 3600.0
# How long the first leg may take to open (the resume exchange) once the socket is accepted.
OPEN_WAIT_S = 10.0
# A failed session's record stays this long for the router to read the reason, then expires.
FAILED_RECORD_S = 30
_TICK_S = 1.0
# The reasons a session ends with (docs/gateway.md, "Tunnels"); a collector closing its socket
# with a reason of its own is counted as "other" (the label's values stay few).
REASONS = frozenset(
    {
        "done", "target_unreachable", "collector_did_not_connect", "collector_gone", "gateway_gone",
        "platform_gone", "platform_did_not_attach", "device_closed", "collector_stopped",
        "idle_timeout", "max_age", "frame_too_large", "tunnel_frame_invalid", "tunnel_window_exceeded",
        "tunnel_data_after_eof", "tunnel_ack_out_of_range", "tunnel_resume_out_of_range",
        "gateway_error",
    }
)  # fmt: skip
# Every series exists from the start, at 0 (alerts and dashboards see a rate, not an absence).
for _protocol in ("1", "2"):
    TUNNEL_SESSIONS.labels(_protocol)
for _reason in (*REASONS, "other"):
    TUNNEL_ENDS.labels(_reason)
for _direction in ("to_platform", "to_device"):
    TUNNEL_BYTES.labels(_direction)

log = get_logger("versus.gateway.tunnel")


@dataclass
class HeldSession:
    """One session held here: its record, its end of the collector leg, and what happened so far."""

    session_id: str
    record: Record
    end: TunnelEnd
    started: float = field(default_factory=time.monotonic)
    opened_at: float | None = None
    attached: bool = False
    leg_lost_at: float | None = None  # the collector's socket dropped; a re-dial may resume
    leg: asyncio.Task[Any] | None = None  # the leg being carried now
    supervisor: asyncio.Task[None] | None = None  # ends and forgets the session
    # The session's span while tracing is on (under the router's OpenTunnel span), ended with it.
    trace: contextlib.AbstractContextManager[tracing.SpanHandle] = tracing.OFF
    span: tracing.SpanHandle = tracing.NO_SPAN

    @property
    def collector_id(self) -> str:
        return self.record.collector_id

    def expired(self, now: float) -> str | None:
        """The reason this session must end now, if one applies."""
        if self.opened_at is None and now > self.started + OPEN_WAIT_S:
            return "collector_gone"
        if self.opened_at is not None and not self.attached and now > self.opened_at + TICKET_TTL_S:
            return "platform_did_not_attach"
        if self.leg_lost_at is not None and now > self.leg_lost_at + RESUME_WINDOW_S:
            return "collector_gone"
        if now > self.end.last_activity + IDLE_TIMEOUT_S:
            return "idle_timeout"
        if now > self.started + MAX_SESSION_S:
            return "max_age"
        return None

    async def stop_leg(self) -> None:
        """End the leg carrying the session, if one still runs: the collector dialled back, so
        that socket was half-open. Only one leg carries a session at a time."""
        previous, self.leg = self.leg, None
        if previous is not None and not previous.done():
            previous.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await previous


class TunnelRegistry:
    """The sessions this gateway process holds, by id."""

    def __init__(self, redis: Redis, gateway_id: str):
        self.redis = redis
        self.gateway_id = gateway_id
        self.attach_url = ""  # set once the attach listener is bound
        self.sessions: dict[str, HeldSession] = {}
        self._supervisors: set[asyncio.Task[None]] = set()

    async def take(self, session_id: str, collector_id: str, version: int) -> HeldSession:
        """The session a dial-back belongs to: held here already (a resume), or taken now."""
        held = self.sessions.get(session_id)
        if held is not None:
            if held.collector_id != collector_id or held.end.ended.is_set():
                raise PermissionDenied("no such tunnel session for this collector", code="tunnel_not_yours")
            if held.end.version < frames.V2 or version < frames.V2:
                raise FailedPrecondition(
                    "this tunnel session cannot be resumed (tunnel protocol 1)", code="tunnel_not_resumable"
                )
            return held
        raw = await self.redis.get(TUNNEL + session_id) if session_id else None
        record = Record.from_json(raw) if raw else None
        if record is None or record.collector_id != collector_id or record.failed:
            # Unknown, over, and someone else's look the same.
            raise PermissionDenied("no such tunnel session for this collector", code="tunnel_not_yours")
        if not await self.redis.set(
            TUNNEL_HOLDER + session_id, self.gateway_id, nx=True, ex=int(MAX_SESSION_S)
        ):
            raise FailedPrecondition(
                "the gateway that held this tunnel session is gone; the session is over", code="gateway_gone"
            )
        held = HeldSession(session_id, record, TunnelEnd(version))
        if record.traceparent:
            attributes: dict[str, tracing.ATTRIBUTE] = {
                "versus.session_id": session_id, "versus.collector_id": collector_id,
                "versus.tunnel.protocol": version,
            }  # fmt: skip
            held.trace = tracing.span(
                "versus.gateway.tunnel", parent=record.traceparent, kind="server", current=False,
                attributes=attributes,
            )  # fmt: skip
            held.span = held.trace.__enter__()
        self.sessions[session_id] = held
        TUNNEL_SESSIONS.labels(str(version)).inc()
        supervisor = held.supervisor = asyncio.create_task(self._supervise(held))
        self._supervisors.add(supervisor)
        supervisor.add_done_callback(self._supervisors.discard)
        log.info("tunnel taken", session_id=session_id, collector_id=collector_id, protocol=version)
        return held

    def ticket_holder(self, session_id: str) -> HeldSession | None:
        """The session a ticket names, if it is held here, open and not yet attached."""
        held = self.sessions.get(session_id)
        if held is None or held.attached or held.opened_at is None or held.end.ended.is_set():
            return None
        if time.monotonic() > held.opened_at + TICKET_TTL_S:
            return None
        return held

    async def _supervise(self, held: HeldSession) -> None:
        end = held.end
        announced = False
        try:
            while not end.ended.is_set():
                if held.opened_at is None and end.opened.is_set():
                    held.opened_at = time.monotonic()
                    await self._announce(held, failed="")
                    announced = True
                if reason := held.expired(time.monotonic()):
                    end.end(reason)
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_TICK_S):
                        await (end.ended.wait() if announced else _first(end.ended, end.opened))
        except Exception:
            log.exception("tunnel supervisor failed", session_id=held.session_id)
            end.end("gateway_error")
        finally:
            self.sessions.pop(held.session_id, None)
            TUNNEL_SESSIONS.labels(str(end.version)).dec()
            TUNNEL_ENDS.labels(end.reason if end.reason in REASONS else "other").inc()
            with contextlib.suppress(Exception):
                if announced:
                    await self.redis.delete(TUNNEL + held.session_id, TUNNEL_HOLDER + held.session_id)
                else:  # the router is still waiting: it reads the reason, then the record expires
                    await self._announce(held, failed=end.reason or "collector_gone")
            log.info("tunnel closed", session_id=held.session_id, reason=end.reason, legs=end.legs)
            held.span.set("versus.tunnel.reason", end.reason)
            held.span.set("versus.tunnel.legs", end.legs)
            held.trace.__exit__(None, None, None)

    async def _announce(self, held: HeldSession, failed: str) -> None:
        """Complete the record (held here, or why it failed) and wake the router waiting for it."""
        record = Record(
            collector_id=held.record.collector_id,
            ticket_sha256=held.record.ticket_sha256,
            direct=held.record.direct,
            gateway="" if failed else self.attach_url,
            gateway_id="" if failed else self.gateway_id,
            failed=failed,
            traceparent=held.record.traceparent,
        )
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(
            TUNNEL + held.session_id, record.to_json(), ex=FAILED_RECORD_S if failed else int(MAX_SESSION_S)
        )
        if failed:
            pipe.delete(TUNNEL_HOLDER + held.session_id)
        pipe.publish(wake_channel(tunnel_wake_key(held.session_id)), b"1")
        await pipe.execute()

    async def close(self) -> None:
        """End every session held here (the gateway is stopping) and wait for their supervisors."""
        for held in list(self.sessions.values()):
            held.end.end("gateway_gone")
        if self._supervisors:
            await asyncio.wait(set(self._supervisors), timeout=5.0)


async def _first(*events: asyncio.Event) -> None:
    """Return once any of ``events`` is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
