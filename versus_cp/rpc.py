"""gRPC calls from the operator CLI: the operator's API token on every call, failures as domain errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from common import error_mapping
from common.config.settings import Settings
from common.errors import Unavailable, VersusError
from common.grpc import token_files
from common.grpc.client import sync_channel

TIMEOUT_S = 15.0


def error_from(exc: grpc.RpcError, address: str, timeout_s: float = TIMEOUT_S) -> VersusError:
    """The domain error behind a failed call (its stable code travels in trailing metadata).

    When the service did not answer, the message says how: no answer within the timeout (it is
    running but slow or wedged) is not the same trouble as a refused connection (it is not running
    there), and an operator — or a test's log — should not have to guess which."""
    why = _why_unreachable(exc, timeout_s)
    unreachable = Unavailable(f"cannot reach the service at {address} ({why}); is the control plane running?")
    return error_mapping.from_rpc_error(exc, unreachable)


def _why_unreachable(exc: grpc.RpcError, timeout_s: float) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout_s:g} s"
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    first = details.strip().splitlines()[0] if details.strip() else "unavailable"
    return first if len(first) <= 200 else first[:199] + "\u2026"


def call(
    settings: Settings,
    address: str,
    stub_class: Callable[[grpc.Channel], Any],
    method: str,
    request: Any,
    timeout_s: float = TIMEOUT_S,
) -> Any:
    """Call ``method`` on the service at ``address``; raise the service's domain error on failure."""
    with sync_channel(address, token_files.operator_token(settings)) as channel:
        try:
            return getattr(stub_class(channel), method)(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise error_from(exc, address, timeout_s) from None


def all_collectors(settings: Settings) -> list[Any]:
    """Every collector the router lists (all pages), as ``fleet_pb2.Collector`` messages."""
    from versus.fleet.v1 import fleet_pb2, fleet_pb2_grpc

    collectors: list[Any] = []
    page = ""
    while True:
        reply = call(settings, settings.router_address, fleet_pb2_grpc.FleetServiceStub, "ListCollectors",
                     fleet_pb2.ListCollectorsRequest(page_token=page))  # fmt: skip
        collectors.extend(reply.collectors)
        page = reply.next_page_token
        if not page:
            return collectors
