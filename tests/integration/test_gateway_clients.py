"""The gateway's calls to the internal services: an unreachable service is a retryable 503 for the
collector and a warning, with what gRPC saw, for the operator."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs
from versus.router.v1 import collector_bridge_pb2 as bridge_pb

from common.embedded.process import free_port
from common.errors import Unavailable
from gateway.clients import Backends, call


async def test_an_unreachable_router_is_backend_unavailable_and_a_warning_that_says_why() -> None:
    nothing_listens = f"127.0.0.1:{free_port()}"
    backends = Backends(nothing_listens, nothing_listens, "token")
    try:
        with capture_logs() as logs, pytest.raises(Unavailable) as refused:
            await call(backends.bridge.Claim, bridge_pb.ClaimRequest(), timeout_s=5)
    finally:
        await backends.close()
    assert refused.value.code == "backend_unavailable"
    assert "127.0.0.1" not in str(refused.value)  # the collector is not told internal addresses
    warning = next(e for e in logs if e["event"] == "internal service unavailable")
    assert warning["method"].endswith("CollectorBridgeService/Claim")
    assert warning["error"] == "UNAVAILABLE"
    assert warning["detail"]  # gRPC's own words: refused, reset, a deadline
