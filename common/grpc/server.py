"""Building blocks for the gRPC service processes.

Every server gets the standard health and reflection services, a bounded
message size, and one interceptor that authenticates the caller (an API token
in the ``authorization`` metadata, checked against :mod:`common.access.rbac`), binds
the caller's request id to the logs, records metrics and maps domain errors to
gRPC status codes (via :mod:`common.error_mapping`, with the stable code in
trailing metadata). Only health checks and reflection need no token.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as _AsyncHealthServicer
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection, reflection_pb2

from common import error_mapping
from common.access import rbac
from common.errors import StartupError, Unauthenticated, VersusError
from common.grpc import uploads
from common.grpc.client import FIXED_WINDOW_OPTIONS
from common.grpc.headers import AUTHORIZATION_HEADER
from common.telemetry import trace_context, tracing
from common.telemetry.logs import (
    REQUEST_ID_HEADER,
    bind_request_id,
    clean_request_id,
    get_logger,
    unbind_request_id,
)
from common.telemetry.metrics import GRPC_LATENCY, GRPC_REQUESTS

# Largest message accepted or sent by any control-plane gRPC server. Params,
# results and release artifacts above this belong in chunked transfers.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

SERVER_OPTIONS: list[tuple[str, Any]] = [
    # grpcio enables SO_REUSEPORT by default, which would let a second process
    # silently share a port that is already in use.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    # Clients ping every 20 s while a call is open (common/grpc/client.py CHANNEL_OPTIONS); a held
    # claim sends no data for longer, so pings without data that often must not count as abuse.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    *FIXED_WINDOW_OPTIONS,
]

log = get_logger("versus.grpc")

# Services whose calls get no server span of their own: the gateways' bridge calls are traced by
# the sites that handle them, under the context each call carries (an idle claim starts no trace).
UNTRACED_SERVICES = frozenset({"versus.router.v1.CollectorBridgeService"})

# The stubs make these generic; at runtime they are not subscriptable, hence string aliases.
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
S = TypeVar("S")

# How long a stop waits, after grpc.aio has cancelled the calls still running, for their handlers
# to unwind (return database connections to their pool, close streams) before it gives up.
HANDLER_UNWIND_S = 5.0


class InFlight:
    """Counts the RPC handlers running now, so a stop can wait until they have unwound.

    ``grpc.aio.Server.stop`` returns as soon as it has cancelled the calls still in flight, before
    their ``finally`` blocks and context managers have run. A caller that then disposes the
    database engine or ends the event loop would cut a connection's return to its pool short: the
    connection is leaked, and found later by the garbage collector.
    """

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """Count the enclosed handler as running until it has unwound."""
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._idle.set()

    async def settled(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for no handler to be running; whether none is."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        return self.count == 0


class Authenticator(Protocol):
    async def authenticate(self, plaintext: str) -> rbac.Principal | None: ...


def bearer_token(value: str | None) -> str | None:
    """The token in an ``authorization: Bearer <token>`` value, or None."""
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


@dataclass(frozen=True, slots=True)
class ServiceRegistration:
    """A servicer and the generated function that adds it to a server."""

    full_name: str
    servicer: object
    add_to_server: Callable[[Any, grpc.aio.Server], None]


def _split(method: str) -> tuple[str, str]:
    _, service, name = method.split("/", 2) if method.count("/") == 2 else ("", "unknown", method)
    return service, name


class ServiceInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Authentication, request ids, metrics and domain-error mapping for every RPC."""

    def __init__(self, authenticator: Authenticator):
        self.authenticator = authenticator
        self.in_flight = InFlight()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler: Handler | None = await continuation(handler_call_details)
        if handler is None:
            # Unknown method: grpc answers UNIMPLEMENTED itself (the stubs call this non-optional).
            return None  # type: ignore[return-value]
        service, method = _split(handler_call_details.method)
        if service == "grpc.health.v1.Health" or service.startswith("grpc.reflection."):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        request_id = clean_request_id(_text(metadata.get(REQUEST_ID_HEADER)))
        call = _Call(
            service, method, handler_call_details.method, request_id,
            bearer_token(_text(metadata.get(AUTHORIZATION_HEADER))),
            _text(metadata.get(trace_context.HEADER)) if service not in UNTRACED_SERVICES else None,
            service not in UNTRACED_SERVICES,
        )  # fmt: skip
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, call),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            # Same wrapper: the request is an async iterator instead of one message.
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(handler.stream_unary, call, upload=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, call),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            # Same wrapper: it only needs to iterate what the handler yields.
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(handler.stream_stream, call),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    async def _authorize(self, call: _Call) -> rbac.Principal:
        if call.token is None:
            raise Unauthenticated(
                "an API token is required (authorization: Bearer <token>)", code="api_token_missing"
            )
        principal = await self.authenticator.authenticate(call.token)
        if principal is None:
            raise Unauthenticated("the API token is unknown, revoked or expired", code="api_token_invalid")
        rbac.authorize(principal, call.full_method)
        return principal

    def _wrap_unary(self, inner: Any, call: _Call, upload: bool = False) -> Any:
        """``upload``: the request is a client stream (an async iterator of messages)."""
        service, method = call.service, call.method

        async def wrapped(request: Any, context: Context) -> Any:
            with self.in_flight.tracking():
                return await handle(request, context)

        async def handle(request: Any, context: Context) -> Any:
            bind_request_id(call.request_id)
            bound = rbac.bind(None)
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            observed = False
            try:
                rbac.bind(await self._authorize(call))
                with _server_span(call, current=True):
                    result = inner(request, context)
                    if inspect.isawaitable(result):
                        result = await result
                code = _context_code(context)
                return result
            except BaseException as exc:
                code = _code_for(exc, context)
                # Counted before the status goes out: a caller that sees the error sees it counted.
                _observe(service, method, code, started)
                observed = True
                if upload and isinstance(exc, VersusError):
                    # Refused before the upload ended: take the rest first, so the client reads
                    # this refusal and not a failed write (common/grpc/uploads.py).
                    await uploads.drain(request, _message_size)
                await _abort_for(exc, code, context, service, method)
                raise
            finally:
                if not observed:
                    _observe(service, method, code, started)
                rbac.unbind(bound)
                unbind_request_id()

        return wrapped

    def _wrap_stream(self, inner: Any, call: _Call) -> Any:
        service, method = call.service, call.method

        async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
            stream = handle(request, context)
            with self.in_flight.tracking():
                try:
                    async for item in stream:
                        yield item
                finally:
                    # Unwound here, where it is counted, not later by garbage collection.
                    await stream.aclose()

        async def handle(request: Any, context: Context) -> AsyncGenerator[Any, None]:
            bind_request_id(call.request_id)
            bound = rbac.bind(None)
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            observed = False
            result: Any = None
            try:
                rbac.bind(await self._authorize(call))
                # Current across the generator's yields: grpc.aio runs a call's handler, and
                # this wrapper's close, in the call's one task, so the context is detached where
                # it was attached.
                with _server_span(call, current=True):
                    result = inner(request, context)
                    if inspect.isasyncgen(result):
                        async for item in result:
                            yield item
                    else:
                        for item in result:
                            yield item
                code = _context_code(context)
            except BaseException as exc:
                code = _code_for(exc, context)
                _observe(service, method, code, started)
                observed = True
                await _abort_for(exc, code, context, service, method)
                raise
            finally:
                if not observed:
                    _observe(service, method, code, started)
                if inspect.isasyncgen(result):
                    # Close the handler's own generator now (its cleanup runs here), rather than
                    # leave it to garbage collection, where it would run in a stray task.
                    with contextlib.suppress(Exception):
                        await result.aclose()
                rbac.unbind(bound)
                unbind_request_id()

        return wrapped


@dataclass(frozen=True, slots=True)
class _Call:
    service: str
    method: str
    full_method: str
    request_id: str
    token: str | None
    traceparent: str | None = None
    traced: bool = False

    def __repr__(self) -> str:  # keep the token out of any log line
        return f"_Call({self.full_method!r})"


def _server_span(call: _Call, *, current: bool) -> AbstractContextManager[tracing.SpanHandle]:
    """The RPC's server span, continuing the caller's ``traceparent`` (when tracing is on)."""
    if not call.traced or not tracing.enabled():
        return tracing.OFF
    return tracing.span(
        call.full_method.lstrip("/"), parent=call.traceparent, root=True, kind="server", current=current,
        attributes={"rpc.system": "grpc", "rpc.service": call.service, "rpc.method": call.method},
    )  # fmt: skip


def _message_size(message: Any) -> int:
    size: int = message.ByteSize()
    return size


def _text(value: str | bytes | None) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _context_code(context: Context) -> grpc.StatusCode:
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK


def _code_for(exc: BaseException, context: Context) -> grpc.StatusCode:
    """The status an exception leaving a handler turns into."""
    if isinstance(exc, grpc.aio.AbortError | GeneratorExit | asyncio.CancelledError):
        code = _context_code(context)
        return grpc.StatusCode.CANCELLED if code == grpc.StatusCode.OK else code
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED
    return error_mapping.status_for(exc).grpc_code


async def _abort_for(
    exc: BaseException, code: grpc.StatusCode, context: Context, service: str, method: str
) -> None:
    """Abort the RPC with ``code`` for a domain error or bug; other exceptions propagate as they are."""
    if isinstance(exc, grpc.aio.AbortError | GeneratorExit | asyncio.CancelledError):
        return
    if isinstance(exc, NotImplementedError):
        await context.abort(code, f"{service}/{method} is not implemented")
    if isinstance(exc, Exception):
        public = public_failure(exc, code, service, method)
        context.set_trailing_metadata(error_mapping.trailing_metadata(public))
        await context.abort(code, public.message)


def public_failure(exc: Exception, code: grpc.StatusCode, service: str, method: str) -> VersusError:
    """What a caller is told of a handler's exception (ending its call with ``code``), logged here:
    a bug with its traceback, a dependency's failure with what the driver said."""
    if code == grpc.StatusCode.INTERNAL:
        log.exception("unhandled error in rpc", service=service, method=method)
    elif not isinstance(exc, VersusError):
        log.warning(
            "dependency unavailable",
            service=service,
            method=method,
            error=type(exc).__name__,
            detail=error_mapping.dependency_detail(exc),
        )
    return error_mapping.public_error(exc)


def status_of(exc: Exception) -> grpc.StatusCode:
    """The status a handler's exception ends its call with (as :func:`_code_for` outside a call)."""
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED
    return error_mapping.status_for(exc).grpc_code


def observe(service: str, method: str, code: grpc.StatusCode, started: float) -> None:
    """Count one call and its latency (``started``: ``time.perf_counter()`` at its start)."""
    _observe(service, method, code, started)


def _observe(service: str, method: str, code: grpc.StatusCode, started: float) -> None:
    GRPC_REQUESTS.labels(service, method, code.name).inc()
    GRPC_LATENCY.labels(service, method).observe(time.perf_counter() - started)


def placeholder(servicer_class: Callable[[], S]) -> S:
    """The generated base servicer: every RPC answers UNIMPLEMENTED until it is built."""
    return servicer_class()


class HealthServicer(_AsyncHealthServicer):  # type: ignore[misc]
    """grpc.health.v1.Health with ``List`` too (the library's servicer answers it UNIMPLEMENTED)."""

    async def List(
        self, request: health_pb2.HealthListRequest, context: Any
    ) -> health_pb2.HealthListResponse:
        statuses = {
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in self._server_status.items()
        }
        return health_pb2.HealthListResponse(statuses=statuses)


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def _serve_reflection_v1(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Reflection v1 beside v1alpha (current grpcurl and buf curl ask for v1 first).

    grpcio-reflection implements only v1alpha; the v1 messages are the same on the wire, so the
    same servicer answers under the v1 name.
    """
    servicer = reflection_aio.ReflectionServicer(service_names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )


class GrpcServer:
    """A grpc.aio server with health, reflection and the service interceptor."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        services: Sequence[ServiceRegistration],
        authenticator: Authenticator,
    ):
        self.name = name
        self.address = f"{host}:{port}"
        self.services = list(services)
        self.health = HealthServicer()
        self.interceptor = ServiceInterceptor(authenticator)
        self.server = grpc.aio.server(interceptors=[self.interceptor], options=SERVER_OPTIONS)

    async def start(self) -> None:
        for reg in self.services:
            reg.add_to_server(reg.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [reg.full_name for reg in self.services]
        listed = [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(listed, self.server)
        _serve_reflection_v1(listed, self.server)
        try:
            bound = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise StartupError(f"cannot listen on {self.address} ({self.name} gRPC): {exc}") from None
        if bound == 0:
            raise StartupError(f"cannot listen on {self.address} ({self.name} gRPC): address already in use")
        await self.server.start()
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        """Every service's health (and the server's, ``""``) SERVING or NOT_SERVING: NOT_SERVING
        while the process cannot do its work (no writable PostgreSQL), so gRPC clients that
        health-check move to another replica."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ["", *(reg.full_name for reg in self.services)]:
            await self.health.set(service, status)

    async def stop(self, grace: float) -> None:
        """Report NOT_SERVING, let in-flight RPCs finish within ``grace``, then close.

        Returns once the handlers of the calls cancelled at the end of ``grace`` have unwound too
        (at most :data:`HANDLER_UNWIND_S` more), so what they held is released before the caller
        closes it.
        """
        await self.health.enter_graceful_shutdown()
        for reg in self.services:
            # Long-lived streams (the gateway's Exchange) are told first, so their clients move new
            # calls elsewhere while what they hold is answered within the grace.
            begin = getattr(reg.servicer, "begin_shutdown", None)
            if begin is not None:
                begin()
        await self.server.stop(grace)
        in_flight = self.interceptor.in_flight
        if not await in_flight.settled(HANDLER_UNWIND_S):
            log.warning("rpc_handlers_still_running", server=self.name, count=in_flight.count)
