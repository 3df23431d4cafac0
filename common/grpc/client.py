"""Client channels that present an API token on every call.

Every control-plane RPC needs a principal (:mod:`common.access.rbac`); these helpers
attach ``authorization: Bearer <token>`` to each call so callers never handle
metadata themselves. The token is held by the interceptor and never logged.

A token may be a string or a callable returning the current one: the callable is
asked on every call, so a token file replaced on disk takes effect at the next
call without a restart (see :mod:`common.grpc.token_files`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from common import error_mapping
from common.config.targets import grpc_target
from common.errors import Unavailable, VersusError
from common.grpc.headers import AUTHORIZATION_HEADER
from common.telemetry import tracing

T = TypeVar("T")

Token = str | Callable[[], str]

# How soon a channel tries again after its server went away. gRPC's defaults (1 s, growing by 1.6
# up to 120 s) suit clients of distant services; between control-plane services a restart that
# took 15 s left callers refusing for several seconds more after the server was back, waiting out
# a backoff that had grown to 10 s. Here the wait stays under 2 s (plus gRPC's 20 % jitter).
RECONNECT_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
# A stream's receive window is fixed, not grown by gRPC's bandwidth-delay probing. Probing grew the
# windows of a tunnel whose far reader had stopped to several MiB per hop, so how much a stalled
# session held depended on the run (tests/integration/test_tunnel_socket.py). Between control-plane
# hosts and their platform (a datacenter, RTT well under 10 ms) 1 MiB still allows > 100 MiB/s per
# stream. Servers use the same (common/grpc/server.py SERVER_OPTIONS).
STREAM_WINDOW_BYTES = 1024 * 1024
FIXED_WINDOW_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
)
# Calls are spread over every address of the target (several replicas, common/config/targets.py); a
# replica whose connection fails is skipped at once. Keepalive pings while calls are open (a held
# claim, a tunnel) find a peer that vanished without closing its connections (a host that died)
# within 30 s instead of the kernel's hours; the servers accept pings that often
# (common/grpc/server.py SERVER_OPTIONS).
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    *RECONNECT_OPTIONS,
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    # Each channel keeps its own connections. gRPC otherwise shares them between a process's
    # channels to the same address, and a channel made after its server came back failed its first
    # call at once while an older channel to that address was waiting out its backoff
    # (tests/integration/test_grpc_server.py). A process holds a handful of long-lived channels, so
    # not sharing costs a few connections.
    ("grpc.use_local_subchannel_pool", 1),
    *FIXED_WINDOW_OPTIONS,
)


def _current(token: Token) -> str:
    return token() if callable(token) else token


def _with_token(metadata: Any, token: str) -> grpc.aio.Metadata:
    pairs = [(k, v) for k, v in (metadata or ()) if k != AUTHORIZATION_HEADER]
    tracing.inject(pairs)  # the current span's context, when tracing is on
    return grpc.aio.Metadata(*pairs, (AUTHORIZATION_HEADER, f"Bearer {token}"))


class _AioBearer:
    def __init__(self, token: Token):
        self._token = token

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<redacted>)"

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            d.method,
            d.timeout,
            _with_token(d.metadata, _current(self._token)),
            d.credentials,
            d.wait_for_ready,
        )


# grpc.aio files each interceptor under the first call kind it implements, so each kind gets its own class.
class _AioUnaryUnary(_AioBearer, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioUnaryStream(_AioBearer, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamUnary(_AioBearer, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _AioStreamStream(_AioBearer, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(details), request_iterator)


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: tuple[tuple[str, str | bytes], ...]):
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _SyncBearer(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    def __init__(self, token: Token):
        self._token = token

    def __repr__(self) -> str:
        return "_SyncBearer(<redacted>)"

    def _details(self, d: Any) -> _SyncDetails:
        pairs = [(k, v) for k, v in (d.metadata or ()) if k != AUTHORIZATION_HEADER]
        tracing.inject(pairs)
        return _SyncDetails(d, (*pairs, (AUTHORIZATION_HEADER, f"Bearer {_current(self._token)}")))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


def aio_channel(address: str, token: Token, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` (one or several replicas: common/config/targets.py) whose every
    call carries ``token``, with :data:`CHANNEL_OPTIONS`."""
    interceptors: list[Any] = [
        kind(token) for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)
    ]
    return grpc.aio.insecure_channel(
        grpc_target(address), options=[*CHANNEL_OPTIONS, *options], interceptors=interceptors
    )


def aio_plain_channel(address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An asyncio channel like :func:`aio_channel` for callers that pass each call's credentials
    themselves (the console acts as the signed-in operator, the router forwards its caller's)."""
    return grpc.aio.insecure_channel(grpc_target(address), options=[*CHANNEL_OPTIONS, *options])


def sync_channel(address: str, token: Token) -> grpc.Channel:
    """A blocking channel to ``address`` whose every call carries ``token``."""
    channel = grpc.insecure_channel(grpc_target(address), options=list(CHANNEL_OPTIONS))
    return grpc.intercept_channel(channel, _SyncBearer(token))


async def call_mapped(
    method: Callable[..., Awaitable[T]],
    request: Any,
    *,
    timeout_s: float,
    metadata: Sequence[tuple[str, str]] | None = None,
) -> T:
    """Invoke a unary RPC of another control-plane service; a failure comes back as the domain
    error that service raised (same kind, same stable code), so the caller's own answer carries it.

    Unreachable or too slow is :class:`Unavailable` (``backend_unavailable``): retry later.
    """
    try:
        return await method(request, timeout=timeout_s, metadata=tuple(metadata) if metadata else None)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # Chained, not hidden: the caller's log says what gRPC saw (refused, reset, deadline);
            # the caller's answer carries only the stable code.
            raise Unavailable(
                "an internal service is unavailable; retry later", code="backend_unavailable"
            ) from exc
        # grpc.aio returns its own Metadata type, iterable as (key, value) pairs.
        metadata_pairs: Any = exc.trailing_metadata() or ()
        pairs = {k: v for k, v in metadata_pairs if isinstance(v, str)}
        error: VersusError = error_mapping.from_grpc(
            code,
            exc.details() or "",
            pairs.get(error_mapping.GRPC_CODE_METADATA_KEY),
            pairs.get(error_mapping.GRPC_DETAILS_METADATA_KEY),
        )
        raise error from None
