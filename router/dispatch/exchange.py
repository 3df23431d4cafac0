"""The gateway's stream: many collectors' bridge calls on one long-lived ``Exchange`` stream.

A gateway keeps one (or a few) of these open to the routers instead of one unary call per
claim, report or output chunk. Each call on the stream runs exactly as the unary RPC of the
same name runs (the same handler of :class:`router.dispatch.grpc_api.CollectorBridgeServicer`),
concurrently with the others, and its answer — or its failure, mapped as a unary call's status
and stable code would be — goes back naming the call. Answers ready together leave in one
message.

What the stream does not change: every hand-out and report is still its own PostgreSQL
transaction fenced by the lease epoch, so a stream that breaks loses nothing a unary call that
broke would not: the gateway answers the collectors whose calls were open 503 and they retry
(a report is answered idempotently).

Limits: at most :data:`MAX_IN_FLIGHT` calls run per stream (held claims count); past that the
router stops reading the stream and gRPC's flow control holds the gateway's writes. A message
carries at most :data:`MAX_BATCH_BYTES` of answers (one larger answer goes alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from versus.router.v1 import collector_bridge_pb2 as bpb

from common import error_mapping
from common.grpc.bridge_calls import BRIDGE_CALLS, SERVICE
from common.grpc.server import observe, public_failure, status_of
from common.telemetry import tracing
from common.telemetry.logs import bind_request_id, clean_request_id, get_logger

log = get_logger("versus.router.exchange")

# Calls one stream may have running at once: a gateway's held claims plus its reports. A gateway
# holding 10,000 collectors parks their idle claims itself, so this is room for a storm's resumes.
MAX_IN_FLIGHT = 20_000
# Answers batched into one message stay under this many bytes (the servers' message limit is 16 MiB).
MAX_BATCH_BYTES = 4 * 1024 * 1024
# A call without a timeout gets this one (the unary path's longest: a held claim plus its margin).
DEFAULT_TIMEOUT_S = 70.0

Handler = Callable[[Any, Any], Awaitable[Any]]


class BridgeExchange:
    """Serves ``Exchange`` streams with the unary handlers of one servicer."""

    def __init__(self, servicer: Any, max_in_flight: int = MAX_IN_FLIGHT):
        self._handlers: dict[str, Handler] = {
            kind: getattr(servicer, name) for kind, name in BRIDGE_CALLS.items()
        }
        self._max_in_flight = max_in_flight
        self._streams: set[_Stream] = set()
        self.draining = False

    def in_flight(self) -> int:
        """Calls running on every open stream now (held claims count)."""
        return sum(len(stream._running) for stream in list(self._streams))

    def in_flight_limit(self) -> int:
        """Most calls the open streams admit at once."""
        return self._max_in_flight * len(self._streams)

    def begin_shutdown(self) -> None:
        """Tell every open stream's gateway to send new calls elsewhere; what runs is answered."""
        self.draining = True
        for stream in self._streams:
            stream.say_draining()

    async def serve(
        self, requests: AsyncIterator[bpb.ExchangeRequest]
    ) -> AsyncIterator[bpb.ExchangeResponse]:
        """Run one stream until the gateway has finished sending and every call is answered."""
        stream = _Stream(self._handlers, self._max_in_flight)
        self._streams.add(stream)
        if self.draining:
            stream.say_draining()
        reader = asyncio.create_task(stream.read(requests))
        try:
            async for message in stream.answers():
                yield message
        finally:
            self._streams.discard(stream)
            reader.cancel()
            await stream.stop()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader


class _Stream:
    def __init__(self, handlers: dict[str, Handler], max_in_flight: int):
        self._handlers = handlers
        self._slots = asyncio.Semaphore(max_in_flight)
        self._running: dict[int, asyncio.Task[None]] = {}
        self._out: asyncio.Queue[bpb.BridgeAnswer | None] = asyncio.Queue()
        self._input_done = False
        self._draining = False
        self._said_draining = False

    def say_draining(self) -> None:
        self._draining = True
        self._out.put_nowait(None)  # wakes the writer to send the flag

    async def read(self, requests: AsyncIterator[bpb.ExchangeRequest]) -> None:
        try:
            async for message in requests:
                for call_id in message.cancelled:
                    task = self._running.get(call_id)
                    if task is not None:
                        task.cancel()
                for call in message.calls:
                    await self._slots.acquire()
                    self._start(call)
        finally:
            self._input_done = True
            self._out.put_nowait(None)

    def _start(self, call: bpb.BridgeCall) -> None:
        kind = call.WhichOneof("call")
        if call.call_id in self._running:
            self._slots.release()
            self._out.put_nowait(_failure(call.call_id, _duplicate_id()))
            return
        task = asyncio.create_task(self._run(call, kind))
        self._running[call.call_id] = task
        # Bookkeeping in a callback, not the coroutine's finally: a task cancelled before its first
        # step never enters its body.
        task.add_done_callback(functools.partial(self._finished, call.call_id))

    def _finished(self, call_id: int, _: asyncio.Task[None]) -> None:
        self._running.pop(call_id, None)
        self._slots.release()
        if self._input_done and not self._running:
            self._out.put_nowait(None)

    async def _run(self, call: bpb.BridgeCall, kind: str | None) -> None:
        started = time.perf_counter()
        method = BRIDGE_CALLS.get(kind or "", "Unknown")
        code = grpc.StatusCode.OK
        bind_request_id(clean_request_id(call.request_id or None))
        try:
            if kind is None or kind not in self._handlers:
                code = grpc.StatusCode.UNIMPLEMENTED
                self._out.put_nowait(_failure(call.call_id, _unknown_call()))
                return
            timeout = call.timeout.seconds + call.timeout.nanos / 1e9 if call.HasField("timeout") else 0.0
            # A call the gateway traced (a sampled task's report) continues the gateway's span.
            span = (
                tracing.span(f"versus.router.{kind}", parent=call.traceparent, kind="server")
                if (call.traceparent)
                else tracing.OFF
            )
            try:
                async with asyncio.timeout(timeout if timeout > 0 else DEFAULT_TIMEOUT_S):
                    with span:
                        reply = await self._handlers[kind](getattr(call, kind), None)
            except TimeoutError:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                self._out.put_nowait(_failure(call.call_id, _deadline()))
                return
            except Exception as exc:
                code = status_of(exc)
                public = public_failure(exc, code, SERVICE, method)
                self._out.put_nowait(_failure(call.call_id, _error_pb(code, public)))
                return
            answer = bpb.BridgeAnswer(call_id=call.call_id)
            getattr(answer, kind).CopyFrom(reply)
            self._out.put_nowait(answer)
        except asyncio.CancelledError:
            # The gateway stopped waiting (or the stream ended): nobody reads an answer.
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            observe(SERVICE, method, code, started)

    async def answers(self) -> AsyncIterator[bpb.ExchangeResponse]:
        """Messages to send, batching what is ready; ends when input is done and nothing runs."""
        while True:
            first = await self._out.get()
            batch: list[bpb.BridgeAnswer] = [] if first is None else [first]
            # Sized only when another answer could join it (one alone goes as is, unmeasured).
            size = first.ByteSize() if first is not None and not self._out.empty() else 0
            while size < MAX_BATCH_BYTES and not self._out.empty():
                item = self._out.get_nowait()
                if item is not None:
                    batch.append(item)
                    if not self._out.empty():
                        size += item.ByteSize()
            flag = self._draining and not self._said_draining
            if batch or flag:
                self._said_draining = self._said_draining or flag
                yield bpb.ExchangeResponse(answers=batch, draining=flag)
            if self._input_done and not self._running and self._out.empty():
                return

    async def stop(self) -> None:
        """Cancel what still runs (the stream is gone) and wait for it to unwind."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _error_pb(code: grpc.StatusCode, error: Any) -> bpb.BridgeError:
    details = error_mapping.trailing_metadata(error)
    detail_json = next((v for k, v in details if k == error_mapping.GRPC_DETAILS_METADATA_KEY), "")
    return bpb.BridgeError(
        status=code.value[0], code=error.code, message=error.message, details_json=detail_json
    )


def _failure(call_id: int, error: bpb.BridgeError) -> bpb.BridgeAnswer:
    return bpb.BridgeAnswer(call_id=call_id, error=error)


def _deadline() -> bpb.BridgeError:
    return bpb.BridgeError(
        status=grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
        code="deadline_exceeded",
        message="deadline exceeded",
    )


def _unknown_call() -> bpb.BridgeError:
    return bpb.BridgeError(
        status=grpc.StatusCode.UNIMPLEMENTED.value[0], code="call_unknown",
        message="this router does not serve that kind of call",
    )  # fmt: skip


def _duplicate_id() -> bpb.BridgeError:
    return bpb.BridgeError(
        status=grpc.StatusCode.INVALID_ARGUMENT.value[0], code="call_id_in_use",
        message="a call with this id is still running on the stream",
    )  # fmt: skip
