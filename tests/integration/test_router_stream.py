"""The gateway's Exchange stream to a real router (gRPC, PostgreSQL, Redis): many collectors' calls
on one stream, each answered or refused exactly as its unary call would be, a call the gateway
stops waiting for stopped at the router, a router that stops or breaks, and an older router."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY
from structlog.testing import capture_logs
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import collector_bridge_pb2_grpc, task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.access.api_tokens import TokenAuthenticator
from common.access.rbac import Role
from common.embedded.process import free_port
from common.errors import InvalidArgument, PermissionDenied, Unavailable
from common.grpc.client import aio_channel
from common.grpc.server import GrpcServer
from gateway import router_link
from gateway.clients import call
from gateway.router_link import RouterLink
from router.dispatch import grpc_api
from router.dispatch.service import Router
from router.server import registrations
from tests.support.access import mint
from tests.support.collector_key import signed
from tests.support.router_env import RouterEnv, make_router, open_envelope

pytestmark = pytest.mark.timeout(60)

BRIDGE = "versus.router.v1.CollectorBridgeService"


@dataclass
class Setup:
    router: Router
    server: GrpcServer
    port: int
    link: RouterLink
    tasks: task_router_pb2_grpc.TaskRouterServiceAsyncStub
    service_token: str
    link_channel: Any

    async def restart(self, servicer: Any = None) -> None:
        """A router process on the same port again (optionally with another bridge servicer)."""
        regs = registrations(self.router)
        if servicer is not None:
            regs = [r if r.full_name != BRIDGE else _with(r, servicer) for r in regs]
        self.server = GrpcServer(
            "router", "127.0.0.1", self.port, regs, TokenAuthenticator(self.router.engine)
        )
        await self.server.start()


def _with(reg: Any, servicer: Any) -> Any:
    return type(reg)(reg.full_name, servicer, reg.add_to_server)


@pytest.fixture
async def setup(database_url: str, redis_url: str) -> AsyncIterator[Setup]:
    router = make_router(database_url, redis_url)
    port = free_port()
    server = GrpcServer("router", "127.0.0.1", port, registrations(router), TokenAuthenticator(router.engine))
    await server.start()
    token = await mint(router.engine, Role.SERVICE)
    bridge_channel = aio_channel(server.address, token)
    platform_channel = aio_channel(server.address, await mint(router.engine, Role.PLATFORM))
    out = Setup(
        router, server, port, RouterLink(bridge_channel, _unary, streams=1),
        task_router_pb2_grpc.TaskRouterServiceStub(platform_channel), token, bridge_channel,
    )  # fmt: skip
    yield out
    await out.link.close()
    await bridge_channel.close(None)
    await platform_channel.close(None)
    await out.server.stop(0)
    await router.aclose()


async def _unary(method: Any, request: Any, request_id: str | None, timeout_s: float) -> Any:
    return await call(method, request, request_id, timeout_s)


def _streams_open(link: RouterLink) -> int:
    return link.streams_open


async def _served(s: Setup, kind: str, request: Any) -> Any:
    """The call's answer once the restarted router serves it (the channel reconnects within ~2 s)."""
    async with asyncio.timeout(10):
        while True:
            try:
                return await s.link.call(kind, request, None, 5)
            except Unavailable:
                await asyncio.sleep(0.2)


def _metric(method: str, code: str) -> float:
    labels = {"service": BRIDGE, "method": method, "code": code}
    return REGISTRY.get_sample_value("versus_grpc_requests_total", labels) or 0.0


def _manifest(collector_id: str) -> bpb.PublishCapabilitiesRequest:
    return bpb.PublishCapabilitiesRequest(
        collector_id=collector_id,
        capability_epoch=2,
        providers=[
            bpb.ProviderCapability(
                provider="stub", max_concurrency=8,
                operations=[bpb.OperationCapability(name="echo", op_class=task_pb2.OP_CLASS_READ)],
            )
        ],
    )  # fmt: skip


def _claim(collector_id: str, seq: int, wait_s: float) -> bpb.ClaimRequest:
    seconds = int(wait_s)
    wait = Duration(seconds=seconds, nanos=int((wait_s - seconds) * 1e9))
    return bpb.ClaimRequest(collector_id=collector_id, claim_seq=seq, wait=wait)


async def _submit(s: Setup, key: str, target: str) -> str:
    deadline = Timestamp()
    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10))
    reply = await s.tasks.SubmitTask(
        pb.SubmitTaskRequest(
            provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ, target_ref=target,
            site_id="site-r", tenant_id="tenant-r", params=b"{}", idempotency_key=key, deadline=deadline,
        )
    )  # fmt: skip
    return reply.task.task_id


async def test_many_collectors_claim_take_and_report_on_one_stream(setup: Setup) -> None:
    env = RouterEnv(setup.router)
    names = [f"col-s{i}" for i in range(20)]
    for name in names:
        await env.add_collector(name, live=False)
    published = await asyncio.gather(
        *(setup.link.call("publish_capabilities", _manifest(n), None, 10) for n in names)
    )
    assert {p.capability_epoch for p in published} == {2}
    # Every collector claims at once and waits; work for each arrives while they wait.
    claims = [asyncio.create_task(setup.link.call("claim", _claim(n, 1, 10), f"r-{n}", 20)) for n in names]
    await asyncio.sleep(0.3)
    # One call for the whole stream is open at the router, however many claims it carries.
    assert setup.server.interceptor.in_flight.count == 1
    for i, name in enumerate(names):
        await _submit(setup, f"k-{i}", f"dev-{name}")
    answers = await asyncio.wait_for(asyncio.gather(*claims), 15)
    taken = {a.dispatch_id: n for a, n in zip(answers, names, strict=True) if a.dispatch_id}
    assert len(taken) == len(names)
    reports = [
        signed(bpb.ReportRequest(collector_id=n, task_id=d, outcome=bpb.REPORT_OUTCOME_SUCCESS, result=b"ok"))
        for d, n in taken.items()
    ]
    for dispatch_id, name in taken.items():
        assert open_envelope(
            next(a for a in answers if a.dispatch_id == dispatch_id).envelope.envelope_json, name
        )
    done = await asyncio.gather(*(setup.link.call("report", r, None, 10) for r in reports))
    assert {(d.duplicate, d.state) for d in done} == {(False, task_pb2.TASK_STATE_SUCCESS)}
    # A report repeated (its answer lost, say) is answered idempotently on the stream too.
    again = await setup.link.call("report", reports[0], None, 10)
    assert again.duplicate
    assert setup.link.streams_open == 1


async def test_a_refusal_carries_the_unary_calls_kind_and_code(setup: Setup) -> None:
    with pytest.raises(InvalidArgument) as missing:
        await setup.link.call("claim", bpb.ClaimRequest(), None, 5)
    assert missing.value.code == "collector_id_missing"
    with pytest.raises(InvalidArgument) as outcome:
        await setup.link.call("report", bpb.ReportRequest(collector_id="c", task_id="d"), None, 5)
    assert outcome.value.code == "outcome_invalid"
    foreign = bpb.ReportRequest(collector_id="c", task_id="dsp-x", outcome=bpb.REPORT_OUTCOME_SUCCESS)
    with pytest.raises(PermissionDenied) as denied:
        await setup.link.call("report", foreign, None, 5)
    assert denied.value.code == "not_your_dispatch"
    # The stream itself is unharmed by its calls' failures.
    await RouterEnv(setup.router).add_collector("col-ok", live=False)
    assert (await setup.link.call("publish_capabilities", _manifest("col-ok"), None, 5)).capability_epoch == 2
    assert _metric("Claim", "INVALID_ARGUMENT") >= 1


async def test_a_claim_the_gateway_stops_waiting_for_stops_at_the_router(setup: Setup) -> None:
    await RouterEnv(setup.router).add_collector("col-c", live=False)
    cancelled_before = _metric("Claim", "CANCELLED")
    held = asyncio.create_task(setup.link.call("claim", _claim("col-c", 1, 30), None, 40))
    await asyncio.sleep(0.5)
    held.cancel()  # the collector's connection went away
    with pytest.raises(asyncio.CancelledError):
        await held
    async with asyncio.timeout(5):
        while _metric("Claim", "CANCELLED") == cancelled_before:  # noqa: ASYNC110 - polls a counter
            await asyncio.sleep(0.05)
    # Past its deadline the call ends at the router too (its own timer or the gateway's cancel,
    # whichever is first), and the caller reads a retryable 503.
    ended = _metric("Claim", "CANCELLED") + _metric("Claim", "DEADLINE_EXCEEDED")
    with pytest.raises(Unavailable) as late:
        await setup.link.call("claim", _claim("col-c", 2, 30), None, 0.5)
    assert late.value.code == "backend_unavailable"
    async with asyncio.timeout(5):
        while _metric("Claim", "CANCELLED") + _metric("Claim", "DEADLINE_EXCEEDED") == ended:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_a_stopping_router_answers_what_it_holds_and_new_calls_take_a_new_stream(setup: Setup) -> None:
    await RouterEnv(setup.router).add_collector("col-d", live=False)
    held = asyncio.create_task(setup.link.call("claim", _claim("col-d", 1, 1.5), None, 10))
    await asyncio.sleep(0.3)
    # The router stops with a grace far longer than the hold: the held claim is answered, not cut,
    # and the stream ends as soon as it is (the gateway was told and closed its side), not when
    # the grace runs out.
    started = time.monotonic()
    with capture_logs() as logs:
        await setup.server.stop(30)
    assert time.monotonic() - started < 15
    answer = await held
    assert not answer.dispatch_id and answer.server_time.seconds > 0
    assert [e["event"] for e in logs if e["event"].startswith("router stream")] == ["router stream draining"]
    async with asyncio.timeout(5):  # the gateway reads the stream's clean end a moment later
        while setup.link.streams_open:  # noqa: ASYNC110 - a count, no event to wait on
            await asyncio.sleep(0.02)
    await setup.restart()
    reply = await _served(setup, "claim", _claim("col-d", 2, 0.001))
    assert reply.server_time.seconds > 0
    assert _streams_open(setup.link) == 1  # a new stream, on the restarted router


async def test_a_stream_that_breaks_fails_its_calls_retryably_and_the_next_call_reconnects(
    setup: Setup,
) -> None:
    await RouterEnv(setup.router).add_collector("col-b", live=False)
    held = asyncio.create_task(setup.link.call("claim", _claim("col-b", 1, 20), None, 30))
    await asyncio.sleep(0.3)
    await setup.server.stop(0)  # no grace: the stream is cut under the held claim
    with pytest.raises(Unavailable) as broken:
        await held
    assert broken.value.code == "backend_unavailable"
    await setup.restart()
    reply = await _served(setup, "claim", _claim("col-b", 2, 0.001))
    assert reply.server_time.seconds > 0


class _OlderBridge(grpc_api.CollectorBridgeServicer):
    """A router from before the stream: its generated base answers Exchange UNIMPLEMENTED."""

    Exchange = collector_bridge_pb2_grpc.CollectorBridgeServiceServicer.Exchange  # type: ignore[assignment]


async def test_an_older_router_without_the_stream_is_called_unary(setup: Setup) -> None:
    await setup.server.stop(0)
    await setup.restart(_OlderBridge(setup.router))
    await RouterEnv(setup.router).add_collector("col-o", live=False)
    unary_before = _metric("PublishCapabilities", "OK")
    reply = await _served(setup, "publish_capabilities", _manifest("col-o"))
    assert reply.capability_epoch == 2
    assert _metric("PublishCapabilities", "OK") == unary_before + 1
    assert _metric("Exchange", "UNIMPLEMENTED") >= 1
    # Later calls go unary at once, without asking for a stream again.
    exchanges = _metric("Exchange", "UNIMPLEMENTED")
    await setup.link.call("publish_capabilities", _manifest("col-o"), None, 5)
    assert _metric("Exchange", "UNIMPLEMENTED") == exchanges


async def test_a_full_stream_makes_a_call_wait_for_room_within_its_deadline(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    await setup.link.close()
    monkeypatch.setattr(router_link, "MAX_PENDING", 1)
    link = RouterLink(setup.link_channel, _unary, streams=1)
    try:
        await RouterEnv(setup.router).add_collector("col-f", live=False)
        held = asyncio.create_task(link.call("claim", _claim("col-f", 1, 2), None, 10))
        await asyncio.sleep(0.3)
        # The one place is taken by the held claim: the next call gets none within its deadline.
        with pytest.raises(Unavailable) as full:
            await link.call("claim", _claim("col-f", 2, 0.001), None, 0.3)
        assert full.value.code == "backend_unavailable"
        assert not (await held).dispatch_id
        # Room again once the held claim is answered.
        assert (await link.call("claim", _claim("col-f", 3, 0.001), None, 5)).server_time.seconds > 0
    finally:
        await link.close()
