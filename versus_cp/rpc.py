"""Synchronous gRPC calls from the operator CLI, with failures turned into one-line errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from common import error_mapping
from common.errors import Unavailable, VersusError

T = TypeVar("T")
TIMEOUT_S = 15.0


def call(address: str, stub_class: Callable[[grpc.Channel], Any], method: str, request: Any) -> Any:
    """Call ``method`` on the service at ``address``; raise the service's domain error on failure."""
    with grpc.insecure_channel(address) as channel:
        try:
            return getattr(stub_class(channel), method)(request, timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(
                    f"cannot reach the service at {address}; is the control plane running?"
                ) from None
            metadata: Any = exc.trailing_metadata() or ()
            versus_code = next((v for k, v in metadata if k == error_mapping.GRPC_CODE_METADATA_KEY), None)
            error: VersusError = error_mapping.from_grpc(code, exc.details() or "", versus_code)
            raise error from None
