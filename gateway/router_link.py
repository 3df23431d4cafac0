"""The gateway's calls to the router on long-lived ``Exchange`` streams, not one RPC each.

Every claim a parked watch forwards, every report, output chunk, capability manifest,
goodbye and revocation ack goes to the router as one :class:`BridgeCall` on one of a few
streams this gateway keeps open (router/dispatch/exchange.py serves them). A call costs a
message on an open stream instead of an HTTP/2 stream with its headers, deadline timer and
interceptors; calls ready together leave in one message and their answers come back the same
way.

Each call keeps a unary call's contract: the same deadline, the same domain error for a
failure, and a collector that stops waiting stops the router's work (the call is named in the
next message's ``cancelled``). When a stream breaks, the calls open on it fail as a broken
unary call fails (503 ``backend_unavailable``, the collector retries; reports are idempotent)
and the next call opens a new stream. A router that is shutting down says so; its stream
takes no new calls and ends once it has answered. A router without ``Exchange`` (an older
version during a rolling upgrade) is called unary, and asked again after
:data:`UNARY_RETRY_S`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import collector_bridge_pb2_grpc

from common import error_mapping
from common.errors import Unavailable, VersusError
from common.grpc.bridge_calls import BRIDGE_CALLS
from common.telemetry import tracing
from common.telemetry.logs import get_logger

log = get_logger("versus.gateway.router_link")

# Calls waiting for an answer on one stream; past it a new call waits (within its deadline) for room.
MAX_PENDING = 20_000
# Calls batched into one message stay under this many bytes (servers accept 16 MiB).
MAX_BATCH_BYTES = 4 * 1024 * 1024
# After a router answered UNIMPLEMENTED to Exchange, calls go unary this long before it is tried again.
UNARY_RETRY_S = 60.0

# Kinds of call: the fields of BridgeCall's oneof ("claim", "report", ...).
KINDS = tuple(BRIDGE_CALLS)


def _unavailable() -> Unavailable:
    return Unavailable("an internal service is unavailable; retry later", code="backend_unavailable")


def error_of(error: bpb.BridgeError) -> VersusError:
    """A call's failure as the same unary call's failure reads (common/grpc/client.py call_mapped)."""
    code = _STATUS_BY_VALUE.get(error.status, grpc.StatusCode.UNKNOWN)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return _unavailable()
    return error_mapping.from_grpc(code, error.message, error.code or None, error.details_json or None)


_STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


class _NoExchange(Exception):
    """The router does not serve Exchange: the call was never started there."""


class _Stream:
    """One Exchange stream: writes calls in batches, reads answers and hands each to its caller."""

    def __init__(self, stub: Any, name: str):
        self._call = stub.Exchange()
        self.name = name
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._room = asyncio.Semaphore(MAX_PENDING)
        self._outbox: collections.deque[bpb.BridgeCall] = collections.deque()
        self._cancelled: list[int] = []
        self._wake = asyncio.Event()
        self.usable = True  # takes new calls: not broken, not draining
        self.ended = False
        self.on_end: Callable[[_Stream], None] = lambda _: None
        self.unsupported = False  # the router answered UNIMPLEMENTED: it has no Exchange
        self._tasks = [asyncio.create_task(self._write()), asyncio.create_task(self._read())]

    async def call(self, kind: str, request: Any, request_id: str | None, timeout_s: float) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                await self._room.acquire()
        except TimeoutError:
            raise _unavailable() from None  # no room within the call's deadline: as a deadline
        try:
            if not self.usable:
                raise self._failure()
            call_id = next(self._ids)
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._pending[call_id] = future
            seconds = int(timeout_s)
            message = bpb.BridgeCall(
                call_id=call_id,
                timeout=Duration(seconds=seconds, nanos=int((timeout_s - seconds) * 1e9)),
                request_id=request_id or "",
                # The current span's context (a traced report's), when tracing is on.
                traceparent=tracing.current_traceparent(),
            )
            getattr(message, kind).CopyFrom(request)
            self._outbox.append(message)
            self._wake.set()
            try:
                async with asyncio.timeout(timeout_s):
                    return await future
            except TimeoutError:
                raise _unavailable() from None
            finally:
                if self._pending.pop(call_id, None) is not None and not self.ended:
                    self._forget(message)
        finally:
            self._room.release()

    def _forget(self, message: bpb.BridgeCall) -> None:
        """A call this side stopped waiting for (cancelled, timed out): never sent, or stopped."""
        try:
            self._outbox.remove(message)
        except ValueError:
            self._cancelled.append(message.call_id)
            self._wake.set()

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox or self._cancelled:
                    batch: list[bpb.BridgeCall] = []
                    size = 0
                    while self._outbox and (not batch or size < MAX_BATCH_BYTES):
                        item = self._outbox.popleft()
                        batch.append(item)
                        if self._outbox:  # sized only when another could join (a call alone goes as is)
                            size += item.ByteSize()
                    cancelled, self._cancelled = self._cancelled, []
                    await self._call.write(bpb.ExchangeRequest(calls=batch, cancelled=cancelled))
                if not self.usable and not self._pending:
                    # Draining (or broken) and nothing is waiting: end our side of the stream.
                    await self._call.done_writing()
                    return
        except Exception as exc:  # the stream ended; the reader fails what is pending and says why
            log.debug("router stream write ended", stream=self.name, error=type(exc).__name__)

    async def _read(self) -> None:
        try:
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:  # type: ignore[attr-defined]
                    break
                if message.draining and self.usable:
                    self.usable = False
                    log.info("router stream draining", stream=self.name, pending=len(self._pending))
                for answer in message.answers:
                    future = self._pending.pop(answer.call_id, None)
                    if future is None or future.done():
                        continue  # the caller gave up on it
                    which = answer.WhichOneof("answer")
                    if which == "error":
                        future.set_exception(error_of(answer.error))
                    else:
                        future.set_result(getattr(answer, which))
                if not self.usable and not self._pending:
                    self._wake.set()
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unsupported = True
            else:
                log.warning(
                    "router stream broke", stream=self.name, error=exc.code().name,
                    detail=(exc.details() or "")[:200], pending=len(self._pending),
                )  # fmt: skip
        finally:
            self._end()

    def _end(self) -> None:
        self.usable = False
        if not self.ended:
            self.on_end(self)
        self.ended = True
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._failure())
        self._wake.set()

    def _failure(self) -> Exception:
        return _NoExchange() if self.unsupported else _unavailable()

    async def close(self) -> None:
        self._call.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._end()


Unary = Callable[[Callable[..., Awaitable[Any]], Any, "str | None", float], Awaitable[Any]]


class RouterLink:
    """Bridge calls to the router on ``streams`` Exchange streams (0: every call unary).

    ``unary(method, request, request_id, timeout_s)`` makes one unary call (gateway/clients.py
    ``call``): used when the router has no Exchange.
    """

    def __init__(self, channel: grpc.aio.Channel, unary: Unary, streams: int = 2):
        self._stub = collector_bridge_pb2_grpc.CollectorBridgeServiceStub(channel)
        self._unary = unary
        self._slots: list[_Stream | None] = [None] * max(streams, 0)
        self._live: set[_Stream] = set()
        self._turn = itertools.count()
        self._unary_until = 0.0
        self._closed = False

    def pending(self) -> int:
        """Calls waiting for the router's answer on the open streams."""
        return sum(len(stream._pending) for stream in self._slots if stream is not None)

    def pending_limit(self) -> int:
        """Most calls the streams take at once (each admits MAX_PENDING)."""
        return MAX_PENDING * len(self._slots)

    async def call(self, kind: str, request: Any, request_id: str | None, timeout_s: float) -> Any:
        """One bridge call (``kind`` one of :data:`KINDS`); a failure is the domain error the unary
        call would raise."""
        if self._slots and not self._closed and time.monotonic() >= self._unary_until:
            try:
                return await self._stream().call(kind, request, request_id, timeout_s)
            except _NoExchange:
                if time.monotonic() >= self._unary_until:
                    log.warning("router has no Exchange stream; calling it unary", retry_in_s=UNARY_RETRY_S)
                    self._unary_until = time.monotonic() + UNARY_RETRY_S
        return await self._unary(getattr(self._stub, BRIDGE_CALLS[kind]), request, request_id, timeout_s)

    def _stream(self) -> _Stream:
        index = next(self._turn) % len(self._slots)
        stream = self._slots[index]
        if stream is None or not stream.usable:
            # A broken or draining stream finishes on its own; new calls go on a new one.
            stream = _Stream(self._stub, f"router-{index}")
            self._slots[index] = stream
            self._live.add(stream)
            stream.on_end = self._live.discard
        return stream

    @property
    def streams_open(self) -> int:
        """Streams not yet ended (draining ones included)."""
        return len(self._live)

    async def close(self) -> None:
        self._closed = True
        self._slots = [None] * len(self._slots)
        live, self._live = list(self._live), set()
        for stream in live:
            await stream.close()
