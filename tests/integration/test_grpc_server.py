"""The shared gRPC server: authentication, health, reflection, error mapping and port handling over
real sockets. Tokens come from an in-memory table here; the PostgreSQL-backed authenticator has its
own tests (test_access.py)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from versus.router.v1 import task_router_pb2, task_router_pb2_grpc

from common.access.rbac import Principal, Role
from common.embedded.process import free_port
from common.error_mapping import GRPC_CODE_METADATA_KEY
from common.errors import NotFound, StartupError
from common.grpc.client import aio_channel
from common.grpc.server import Context, GrpcServer, ServiceRegistration, placeholder
from common.telemetry.metrics import GRPC_REQUESTS

SECRET = "postgresql://u:hunter2@db"
PLATFORM_TOKEN = "vsk_platform-test-token"
VIEWER_TOKEN = "vsk_viewer-test-token"


class StaticTokens:
    def __init__(self) -> None:
        self.tokens = {
            PLATFORM_TOKEN: Principal("tok_p", "platform", Role.PLATFORM),
            VIEWER_TOKEN: Principal("tok_v", "viewer", Role.VIEWER),
        }

    async def authenticate(self, plaintext: str) -> Principal | None:
        return self.tokens.get(plaintext)


class Router(task_router_pb2_grpc.TaskRouterServiceServicer):
    # "slow": the handler holds a resource and takes a moment to give it back when cancelled
    # (as a database connection's return to its pool does).
    slow_started: ClassVar[asyncio.Event] = asyncio.Event()
    slow_released: ClassVar[list[float]] = []

    async def GetTask(
        self, request: task_router_pb2.GetTaskRequest, context: Context
    ) -> task_router_pb2.GetTaskResponse:
        if request.task_id == "slow":
            Router.slow_started.set()
            try:
                await asyncio.sleep(30)
            finally:
                await asyncio.shield(asyncio.sleep(0.3))
                Router.slow_released.append(time.monotonic())
        if request.task_id == "boom":
            raise RuntimeError(f"lost connection to {SECRET}")
        raise NotFound(f"task {request.task_id} does not exist", code="task_not_found")


@pytest.fixture
async def server() -> AsyncIterator[GrpcServer]:
    reg = ServiceRegistration(
        "versus.router.v1.TaskRouterService",
        placeholder(Router),
        task_router_pb2_grpc.add_TaskRouterServiceServicer_to_server,
    )
    srv = GrpcServer("test", "127.0.0.1", free_port(), [reg], StaticTokens())
    await srv.start()
    yield srv
    await srv.stop(0)


async def test_health_reports_each_service_serving(server: GrpcServer) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "versus.router.v1.TaskRouterService"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Check(health_pb2.HealthCheckRequest(service="versus.nope.v1.Nope"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        # Reflection lists Health/List: it answers too (the library's servicer does not).
        listed = await stub.List(health_pb2.HealthListRequest())
        assert {name: r.status for name, r in listed.statuses.items()} == {
            "": health_pb2.HealthCheckResponse.SERVING,
            "versus.router.v1.TaskRouterService": health_pb2.HealthCheckResponse.SERVING,
        }


async def test_stop_returns_once_cancelled_handlers_have_released_what_they_held(server: GrpcServer) -> None:
    # grpc.aio's own stop returns as soon as it has cancelled the call; the database engine is
    # disposed next, and a connection still on its way back to the pool was leaked.
    srv = server
    Router.slow_started.clear()
    Router.slow_released.clear()
    async with aio_channel(srv.address, PLATFORM_TOKEN) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        call = stub.GetTask(task_router_pb2.GetTaskRequest(task_id="slow"))
        await asyncio.wait_for(Router.slow_started.wait(), 10)
        assert srv.interceptor.in_flight.count == 1
        await srv.stop(0)
        stopped = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError):
            await call
    assert len(Router.slow_released) == 1 and Router.slow_released[0] <= stopped
    assert srv.interceptor.in_flight.count == 0


async def test_reflection_lists_services(server: GrpcServer) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = set()
        async for reply in stub.ServerReflectionInfo(requests()):
            names |= {s.name for s in reply.list_services_response.service}
    assert {"versus.router.v1.TaskRouterService", "grpc.health.v1.Health"} <= names


async def test_reflection_v1_is_served_too(server: GrpcServer) -> None:
    """grpcurl and buf curl ask for grpc.reflection.v1 first: it answers like v1alpha."""
    async with grpc.aio.insecure_channel(server.address) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )

        async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")
            yield reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="versus.router.v1.TaskRouterService"
            )

        replies = [reply async for reply in call(requests())]
    assert "versus.router.v1.TaskRouterService" in {s.name for s in replies[0].list_services_response.service}
    assert replies[1].file_descriptor_response.file_descriptor_proto


async def test_domain_error_maps_to_status_and_stable_code(server: GrpcServer) -> None:
    before = GRPC_REQUESTS.labels("versus.router.v1.TaskRouterService", "GetTask", "NOT_FOUND")._value.get()
    async with aio_channel(server.address, PLATFORM_TOKEN) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        call = stub.GetTask(task_router_pb2.GetTaskRequest(task_id="t-1"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "task t-1 does not exist"
    # grpc.aio returns its own Metadata type, iterable as (key, value) pairs.
    metadata: Any = info.value.trailing_metadata()
    trailing = [tuple(item) for item in metadata]
    assert (GRPC_CODE_METADATA_KEY, "task_not_found") in trailing
    after = GRPC_REQUESTS.labels("versus.router.v1.TaskRouterService", "GetTask", "NOT_FOUND")._value.get()
    assert after == before + 1


async def test_unexpected_error_is_internal_without_details(server: GrpcServer) -> None:
    async with aio_channel(server.address, PLATFORM_TOKEN) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetTask(task_router_pb2.GetTaskRequest(task_id="boom"))
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "hunter2" not in (info.value.details() or "")


async def test_rpcs_not_built_yet_answer_unimplemented(server: GrpcServer) -> None:
    async with aio_channel(server.address, PLATFORM_TOKEN) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CancelTask(task_router_pb2.CancelTaskRequest(task_id="t"))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_busy_port_is_a_startup_error() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        reg = ServiceRegistration(
            "versus.router.v1.TaskRouterService",
            placeholder(Router),
            task_router_pb2_grpc.add_TaskRouterServiceServicer_to_server,
        )
        srv = GrpcServer("test", "127.0.0.1", port, [reg], StaticTokens())
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            await srv.start()
        await srv.server.stop(0)


async def test_request_id_from_metadata_is_bound_to_handler_logs(server: GrpcServer) -> None:
    import io
    import json
    import logging

    from common.telemetry.logs import configure_logging

    configure_logging(fmt="json", level="INFO", cache=False)
    stream = io.StringIO()
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        async with aio_channel(server.address, PLATFORM_TOKEN) as channel:
            stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetTask(
                    task_router_pb2.GetTaskRequest(task_id="boom"), metadata=(("x-request-id", "rq-77"),)
                )
    finally:
        configure_logging(cache=False)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    failure = next(e for e in events if e["event"] == "unhandled error in rpc")
    assert failure["request_id"] == "rq-77"
    assert "hunter2" not in stream.getvalue()


def _code(info: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> str | None:
    metadata: Any = info.value.trailing_metadata()
    return next((v for k, v in metadata if k == GRPC_CODE_METADATA_KEY), None)


async def test_a_call_without_a_token_is_unauthenticated(server: GrpcServer) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetTask(task_router_pb2.GetTaskRequest(task_id="t-1"))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _code(info) == "api_token_missing"


@pytest.mark.parametrize(
    "header", ["Bearer vsk_nobody", "Basic dXNlcjpwdw==", "Bearer", "vsk_platform-test-token"]
)
async def test_an_unknown_or_malformed_token_is_unauthenticated(server: GrpcServer, header: str) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetTask(
                task_router_pb2.GetTaskRequest(task_id="t-1"), metadata=(("authorization", header),)
            )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _code(info) in {"api_token_missing", "api_token_invalid"}


async def test_a_role_outside_the_policy_is_permission_denied(server: GrpcServer) -> None:
    async with aio_channel(server.address, VIEWER_TOKEN) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SubmitTask(task_router_pb2.SubmitTaskRequest())
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert _code(info) == "permission_denied"
        # The same token may read: the handler runs and answers for itself.
        with pytest.raises(grpc.aio.AioRpcError) as read:
            await stub.GetTask(task_router_pb2.GetTaskRequest(task_id="t-1"))
        assert read.value.code() == grpc.StatusCode.NOT_FOUND


async def _placeholder_router(port: int) -> GrpcServer:
    """A started server on ``port`` whose router RPCs all answer NOT_FOUND: a call that gets that
    answer reached the handler."""
    reg = ServiceRegistration(
        "versus.router.v1.TaskRouterService",
        placeholder(Router),
        task_router_pb2_grpc.add_TaskRouterServiceServicer_to_server,
    )
    srv = GrpcServer("test", "127.0.0.1", port, [reg], StaticTokens())
    await srv.start()
    return srv


@pytest.mark.timeout(120)
async def test_a_client_is_served_again_within_seconds_of_its_server_coming_back() -> None:
    # With gRPC's default backoff (1 s, x1.6, up to 120 s) a server down for 30 s was tried again
    # only some 13 s after it was back: the gateway answered 503 all that time (a chaos run saw it).
    port = free_port()
    srv = await _placeholder_router(port)

    async def answered(stub: Any) -> bool:
        try:
            await stub.GetTask(task_router_pb2.GetTaskRequest(task_id="t-1"), timeout=1)
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.NOT_FOUND  # the handler's answer: the server is there
        return True

    async with aio_channel(srv.address, PLATFORM_TOKEN) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        assert await answered(stub)
        await srv.stop(0)
        down = time.monotonic()
        while time.monotonic() - down < 30:  # calls keep failing (and the backoff growing) meanwhile
            assert not await answered(stub)
            await asyncio.sleep(0.5)
        srv = await _placeholder_router(port)
        back = time.monotonic()
        try:
            while not await answered(stub):
                assert time.monotonic() - back < 20, "not reconnected"
                await asyncio.sleep(0.05)
            assert time.monotonic() - back < 4.0
        finally:
            await srv.stop(0)


async def test_a_new_channel_does_not_inherit_another_channels_backoff() -> None:
    # gRPC shares connections (subchannels) between a process's channels to the same address. A
    # channel made after a server came back then failed its first call at once ("connections to all
    # backends failing") while an older channel to that address waited out its backoff: a test's
    # gateway could not reach its new enrollment service because a channel of an earlier test, to
    # a server long gone whose port had come round again, was still trying to reconnect.
    port = free_port()
    srv = await _placeholder_router(port)
    request = task_router_pb2.GetTaskRequest(task_id="t-1")
    async with aio_channel(srv.address, PLATFORM_TOKEN) as old:
        with pytest.raises(grpc.aio.AioRpcError) as served:
            await task_router_pb2_grpc.TaskRouterServiceStub(old).GetTask(request, timeout=5)
        assert served.value.code() == grpc.StatusCode.NOT_FOUND  # the handler answered
        await srv.stop(0)
        with pytest.raises(grpc.aio.AioRpcError) as down:
            await task_router_pb2_grpc.TaskRouterServiceStub(old).GetTask(request, timeout=5)
        assert down.value.code() == grpc.StatusCode.UNAVAILABLE  # and now it waits to try again
        srv = await _placeholder_router(port)
        try:
            async with aio_channel(srv.address, PLATFORM_TOKEN) as new:
                with pytest.raises(grpc.aio.AioRpcError) as first:
                    await task_router_pb2_grpc.TaskRouterServiceStub(new).GetTask(request, timeout=5)
                assert first.value.code() == grpc.StatusCode.NOT_FOUND, first.value.details()
        finally:
            await srv.stop(0)
