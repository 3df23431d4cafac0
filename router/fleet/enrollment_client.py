"""The router's calls to the enrollment service, made on behalf of the operator who asked.

The enrollment service owns collector identity and status (docs/architecture.md,
"Who writes what"): approve, deny and revoke are its RPCs. The router's
FleetService forwards the operator's own ``authorization`` metadata, so the
enrollment service authorises the real caller with its RBAC and records that
caller in the audit log — the router holds no standing right to change a
collector's status.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from versus.enrollment.v1 import enrollment_pb2 as pb
from versus.enrollment.v1 import enrollment_pb2_grpc

from common.grpc.client import aio_plain_channel, call_mapped
from common.grpc.headers import AUTHORIZATION_HEADER
from common.grpc.server import MAX_MESSAGE_BYTES
from common.telemetry.logs import REQUEST_ID_HEADER

CALL_TIMEOUT_S = 10.0
# The metadata a forwarded call carries: who is asking, and the request id for the logs.
FORWARDED = (REQUEST_ID_HEADER, AUTHORIZATION_HEADER)

Metadata = Sequence[tuple[str, str]]


def forwarded(invocation_metadata: Iterable[Any] | None) -> list[tuple[str, str]]:
    """The caller's credentials and request id, taken from the metadata of the RPC being served."""
    return [(k, v) for k, v in (invocation_metadata or ()) if k in FORWARDED and isinstance(v, str)]


class EnrollmentClient:
    """Collector status transitions, through the enrollment service."""

    def __init__(self, address: str):
        self._channel = aio_plain_channel(
            address,
            [
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = enrollment_pb2_grpc.EnrollmentServiceStub(self._channel)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    async def approve(self, collector_id: str, metadata: Metadata) -> str:
        reply = await call_mapped(
            self._stub.ApproveCollector, pb.ApproveCollectorRequest(collector_id=collector_id),
            timeout_s=CALL_TIMEOUT_S, metadata=metadata,
        )  # fmt: skip
        return str(reply.status)

    async def deny(self, collector_id: str, reason: str, metadata: Metadata) -> str:
        reply = await call_mapped(
            self._stub.DenyCollector, pb.DenyCollectorRequest(collector_id=collector_id, reason=reason),
            timeout_s=CALL_TIMEOUT_S, metadata=metadata,
        )  # fmt: skip
        return str(reply.status)

    async def revoke(self, collector_id: str, reason: str, metadata: Metadata) -> str:
        reply = await call_mapped(
            self._stub.RevokeCollector, pb.RevokeCollectorRequest(collector_id=collector_id, reason=reason),
            timeout_s=CALL_TIMEOUT_S, metadata=metadata,
        )  # fmt: skip
        return str(reply.status)

    async def close(self) -> None:
        await self._channel.close(None)
