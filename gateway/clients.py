"""gRPC clients the gateway uses to reach the internal services, with errors mapped back to domain errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from versus.enrollment.v1 import enrollment_pb2_grpc
from versus.router.v1 import collector_bridge_pb2_grpc

from common.errors import Unavailable
from common.grpc.client import Token, aio_channel, call_mapped
from common.telemetry.logs import REQUEST_ID_HEADER, get_logger
from gateway.router_link import RouterLink

log = get_logger("versus.gateway.clients")

# Every internal call gets a deadline; a wedged service must not hold a collector request forever.
CALL_TIMEOUT_S = 10.0

T = TypeVar("T")


class Backends:
    """Channels to the enrollment service and the router.

    Collector traffic for the router goes through :meth:`bridge_call`: on ``router_streams``
    long-lived Exchange streams (gateway/router_link.py), or one unary call each when that is 0.
    """

    def __init__(self, enrollment_address: str, router_address: str, token: Token, router_streams: int = 2):
        self._enrollment_channel = aio_channel(enrollment_address, token)
        self._router_channel = aio_channel(router_address, token)
        self.enrollment = enrollment_pb2_grpc.EnrollmentServiceStub(self._enrollment_channel)
        self.bridge = collector_bridge_pb2_grpc.CollectorBridgeServiceStub(self._router_channel)
        self.router_link = RouterLink(self._router_channel, _unary, router_streams)

    async def bridge_call(
        self, kind: str, request: Any, request_id: str | None = None, timeout_s: float = CALL_TIMEOUT_S
    ) -> Any:
        """One CollectorBridgeService call (``kind``: gateway/router_link.py ``KINDS``); a failure is
        the domain error the router raised (503 ``backend_unavailable`` when it did not answer)."""
        return await self.router_link.call(kind, request, request_id, timeout_s)

    async def close(self) -> None:
        await self.router_link.close()
        await self._enrollment_channel.close(None)
        await self._router_channel.close(None)


async def _unary(
    method: Callable[..., Awaitable[Any]], request: Any, request_id: str | None, timeout_s: float
) -> Any:
    return await call(method, request, request_id, timeout_s)


async def call(
    method: Callable[..., Awaitable[T]],
    request: Any,
    request_id: str | None = None,
    timeout_s: float = CALL_TIMEOUT_S,
) -> T:
    """Invoke a unary RPC; a failure comes back as the domain error the service raised."""
    metadata = ((REQUEST_ID_HEADER, request_id),) if request_id else None
    try:
        return await call_mapped(method, request, timeout_s=timeout_s, metadata=metadata)
    except Unavailable as exc:
        cause = exc.__cause__
        if isinstance(cause, grpc.aio.AioRpcError):
            # The collector sees 503 backend_unavailable; the operator sees which call and why.
            details = (cause.details() or "").splitlines()
            log.warning(
                "internal service unavailable",
                method=_method_name(method),
                error=cause.code().name,
                detail=details[0][:200] if details else "",
            )
        raise


def _method_name(method: object) -> str:
    """The RPC's name (``/versus.router.v1.CollectorBridgeService/Claim``) for a log line."""
    name = getattr(method, "_method", b"")
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)
