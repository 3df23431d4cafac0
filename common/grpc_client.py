"""Client channels that present an API token on every call.

Every control-plane RPC needs a principal (:mod:`common.rbac`); these helpers
attach ``authorization: Bearer <token>`` to each call so callers never handle
metadata themselves. The token is held by the interceptor and never logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from common.grpc_server import AUTHORIZATION_HEADER


def _with_token(metadata: Any, token: str) -> grpc.aio.Metadata:
    pairs = [(k, v) for k, v in (metadata or ()) if k != AUTHORIZATION_HEADER]
    return grpc.aio.Metadata(*pairs, (AUTHORIZATION_HEADER, f"Bearer {token}"))


class _AioBearer:
    def __init__(self, token: str):
        self._token = token

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<redacted>)"

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            d.method, d.timeout, _with_token(d.metadata, self._token), d.credentials, d.wait_for_ready
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
    def __init__(self, token: str):
        self._token = token

    def __repr__(self) -> str:
        return "_SyncBearer(<redacted>)"

    def _details(self, d: Any) -> _SyncDetails:
        pairs = [(k, v) for k, v in (d.metadata or ()) if k != AUTHORIZATION_HEADER]
        return _SyncDetails(d, (*pairs, (AUTHORIZATION_HEADER, f"Bearer {self._token}")))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


def aio_channel(address: str, token: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` whose every call carries ``token``."""
    interceptors: list[Any] = [
        kind(token) for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)
    ]
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


def sync_channel(address: str, token: str) -> grpc.Channel:
    """A blocking channel to ``address`` whose every call carries ``token``."""
    return grpc.intercept_channel(grpc.insecure_channel(address), _SyncBearer(token))
