"""Every RPC of every service, over a real socket: refused without a token and for each role outside
its policy; accepted roles get past authorization (the handler then answers for itself)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from common.access.rbac import POLICY, Role
from common.error_mapping import GRPC_CODE_METADATA_KEY
from common.grpc.client import aio_channel
from tests.integration import test_gateway_collector as gw
from tests.support.access import SERVICES, mint

pytestmark = pytest.mark.timeout(120)
stack = gw.stack


def _identity(data: bytes) -> bytes:
    return data


GATE_CODES = {"api_token_missing", "api_token_invalid", "permission_denied"}


async def _status(channel: grpc.aio.Channel, method: str) -> tuple[grpc.StatusCode, str]:
    """Invoke ``method`` with an empty request (or stream): the status it ends with and its stable code."""
    service_name, name = method.strip("/").split("/")
    descriptor = SERVICES[service_name].methods_by_name[name]
    kinds = (descriptor.client_streaming, descriptor.server_streaming)
    try:
        if kinds == (False, False):
            await channel.unary_unary(method, _identity, _identity)(b"", timeout=10)
            return grpc.StatusCode.OK, ""
        elif kinds == (False, True):
            async for _ in channel.unary_stream(method, _identity, _identity)(b"", timeout=10):
                break
            return grpc.StatusCode.OK, ""
        else:

            async def nothing() -> AsyncIterator[bytes]:
                empty: tuple[bytes, ...] = ()
                for item in empty:
                    yield item

            call = channel.stream_stream(method, _identity, _identity)(nothing(), timeout=10)
            async for _ in call:
                break
            code = await call.code()
            metadata: Any = await call.trailing_metadata() or ()
            return code, next((v for k, v in metadata if k == GRPC_CODE_METADATA_KEY), "")
    except grpc.aio.AioRpcError as exc:
        metadata = exc.trailing_metadata() or ()
        return exc.code(), next((v for k, v in metadata if k == GRPC_CODE_METADATA_KEY), "")


async def test_every_rpc_refuses_a_missing_token_and_roles_outside_its_policy(stack: gw.Stack) -> None:
    tokens = {role: await mint(stack.router.engine, role) for role in Role}
    anonymous = grpc.aio.insecure_channel(stack.grpc_address)
    channels = {role: aio_channel(stack.grpc_address, token) for role, token in tokens.items()}
    checked = 0
    try:
        for method, allowed in sorted(POLICY.items()):
            assert await _status(anonymous, method) == (grpc.StatusCode.UNAUTHENTICATED, "api_token_missing")
            for role, channel in channels.items():
                code, versus_code = await _status(channel, method)
                if role in allowed:
                    assert versus_code not in GATE_CODES, (method, role, code, versus_code)
                else:
                    assert (code, versus_code) == (grpc.StatusCode.PERMISSION_DENIED, "permission_denied"), (
                        method,
                        role,
                    )
                checked += 1
    finally:
        await anonymous.close(None)
        for channel in channels.values():
            await channel.close(None)
    assert checked == len(POLICY) * len(Role)
