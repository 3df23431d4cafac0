"""TaskRouterService and CollectorBridgeService over real gRPC, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY
from sqlalchemy import func, select
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import collector_bridge_pb2_grpc, task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.access.api_tokens import TokenAuthenticator
from common.access.rbac import Role
from common.db.schema import audit_events, tasks
from common.embedded.process import free_port
from common.error_mapping import GRPC_CODE_METADATA_KEY
from common.grpc.client import aio_channel
from common.grpc.server import GrpcServer
from router.dispatch import grpc_api
from router.server import registrations
from tests.support.access import mint
from tests.support.collector_key import signed
from tests.support.router_env import RouterEnv, make_router, open_envelope

pytestmark = pytest.mark.timeout(60)


@dataclass
class Api:
    env: RouterEnv
    # The async stub types exist only in the .pyi files; annotations are not evaluated.
    tasks: task_router_pb2_grpc.TaskRouterServiceAsyncStub
    bridge: collector_bridge_pb2_grpc.CollectorBridgeServiceAsyncStub
    # The dispatch queue, as an operator sees it.
    ops: task_router_pb2_grpc.TaskRouterServiceAsyncStub
    address: str = ""


@pytest.fixture
async def api(database_url: str, redis_url: str) -> AsyncIterator[Api]:
    router = make_router(database_url, redis_url)
    server = GrpcServer(
        "router", "127.0.0.1", free_port(), registrations(router), TokenAuthenticator(router.engine)
    )
    await server.start()
    channels = [
        aio_channel(server.address, await mint(router.engine, role))
        for role in (Role.PLATFORM, Role.SERVICE, Role.OPERATOR)
    ]
    yield Api(
        RouterEnv(router),
        task_router_pb2_grpc.TaskRouterServiceStub(channels[0]),
        collector_bridge_pb2_grpc.CollectorBridgeServiceStub(channels[1]),
        task_router_pb2_grpc.TaskRouterServiceStub(channels[2]),
        server.address,
    )
    for channel in channels:
        await channel.close(None)
    await server.stop(0)
    await router.aclose()


def _deadline(seconds: int = 600) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds))
    return out


def _submit(**changes: Any) -> pb.SubmitTaskRequest:
    base: dict[str, Any] = {
        "provider": "stub", "operation": "echo", "op_class": task_pb2.OP_CLASS_READ, "target_ref": "dev-1",
        "site_id": "site-r", "tenant_id": "tenant-r", "params": b"{}", "idempotency_key": "k-1",
        "deadline": _deadline(),
    }  # fmt: skip
    base.update(changes)
    return pb.SubmitTaskRequest(**base)


async def _error(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    metadata: Any = info.value.trailing_metadata() or ()
    code = next((v for k, v in metadata if k == GRPC_CODE_METADATA_KEY), "")
    return info.value.code(), code


async def _publish(api: Api, collector_id: str) -> None:
    await api.env.add_collector(collector_id, live=False)
    reply = await api.bridge.PublishCapabilities(
        bpb.PublishCapabilitiesRequest(
            collector_id=collector_id,
            capability_epoch=2,
            providers=[
                bpb.ProviderCapability(
                    provider="stub",
                    max_concurrency=8,
                    operations=[
                        bpb.OperationCapability(name="echo", op_class=task_pb2.OP_CLASS_READ),
                        bpb.OperationCapability(name="set", op_class=task_pb2.OP_CLASS_MUTATE_TERMINAL),
                    ],
                )
            ],
        )
    )
    assert reply.capability_epoch == 2


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_full_flow_over_grpc(api: Api) -> None:
    successes = _metric("versus_router_dispatch_transitions_total", state="success")
    claim_waits = _metric("versus_router_claim_wait_seconds_count")
    await _publish(api, "col-g")
    # The first claim makes the collector live; nothing is waiting yet.
    empty = await api.bridge.Claim(
        bpb.ClaimRequest(collector_id="col-g", claim_seq=1, wait=Duration(nanos=1000))
    )
    assert not empty.HasField("envelope") and empty.server_time.seconds > 0
    submitted = await api.tasks.SubmitTask(_submit())
    assert submitted.task.state == task_pb2.TASK_STATE_LEASED
    again = await api.tasks.SubmitTask(_submit())
    assert again.existing and again.task.task_id == submitted.task.task_id
    claimed = await api.bridge.Claim(
        bpb.ClaimRequest(collector_id="col-g", claim_seq=2, wait=Duration(seconds=1))
    )
    envelope = open_envelope(claimed.envelope.envelope_json, "col-g")
    assert envelope["task_id"] == claimed.dispatch_id
    watch = api.tasks.WatchTask(pb.WatchTaskRequest(task_id=submitted.task.task_id))
    done = bpb.ReportRequest(
        collector_id="col-g", task_id=claimed.dispatch_id, outcome=bpb.REPORT_OUTCOME_SUCCESS, result=b"done"
    )
    report = await api.bridge.Report(signed(done))
    assert (report.duplicate, report.state) == (False, task_pb2.TASK_STATE_SUCCESS)
    seen = [update.task.state async for update in watch]
    assert seen[-1] == task_pb2.TASK_STATE_SUCCESS
    task = (await api.tasks.GetTask(pb.GetTaskRequest(task_id=submitted.task.task_id))).task
    assert [t.to_state for t in task.history] == [
        task_pb2.TASK_STATE_QUEUED, task_pb2.TASK_STATE_ROUTED, task_pb2.TASK_STATE_LEASED,
        task_pb2.TASK_STATE_DISPATCHED, task_pb2.TASK_STATE_SUCCESS,
    ]  # fmt: skip
    assert task.result == b"done"
    listed = await api.ops.ListDispatches(pb.ListDispatchesRequest(states=[task_pb2.TASK_STATE_SUCCESS]))
    assert [d.dispatch_id for d in listed.dispatches] == [claimed.dispatch_id]
    assert _metric("versus_router_dispatch_transitions_total", state="success") == successes + 1
    assert _metric("versus_router_claim_wait_seconds_count") == claim_waits + 2
    assert _metric("versus_router_submit_to_claim_seconds_count") >= 1


async def test_list_dispatches_paginates(api: Api) -> None:
    await _publish(api, "col-p")
    await api.bridge.Claim(bpb.ClaimRequest(collector_id="col-p"))
    for i in range(5):
        await api.tasks.SubmitTask(_submit(idempotency_key=f"p-{i}", target_ref=f"d-{i}"))
    seen: list[str] = []
    token = ""
    while True:
        page = await api.ops.ListDispatches(pb.ListDispatchesRequest(page_size=2, page_token=token))
        seen += [d.dispatch_id for d in page.dispatches]
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 5


@pytest.mark.parametrize(
    ("request_changes", "status", "code"),
    [
        ({"op_class": task_pb2.OP_CLASS_UNSPECIFIED}, grpc.StatusCode.INVALID_ARGUMENT, "op_class_invalid"),
        ({"provider": ""}, grpc.StatusCode.INVALID_ARGUMENT, "provider_missing"),
        ({"deadline": _deadline(-60)}, grpc.StatusCode.INVALID_ARGUMENT, "deadline_past"),
        ({"deadline": None}, grpc.StatusCode.INVALID_ARGUMENT, "deadline_missing"),
        ({"params": b"x" * (1024 * 1024 + 1)}, grpc.StatusCode.RESOURCE_EXHAUSTED, "params_too_large"),
        ({"target_ref": "bad\nref"}, grpc.StatusCode.INVALID_ARGUMENT, "target_ref_invalid"),
    ],
)
async def test_bad_submissions(
    api: Api, request_changes: dict[str, Any], status: grpc.StatusCode, code: str
) -> None:
    assert await _error(api.tasks.SubmitTask(_submit(**request_changes))) == (status, code)
    async with api.env.router.engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(tasks))).scalar_one() == 0


async def test_bad_input_on_every_other_rpc(api: Api) -> None:
    invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    assert await _error(api.tasks.GetTask(pb.GetTaskRequest(task_id="tsk-none"))) == (
        not_found,
        "task_not_found",
    )
    assert await _error(api.tasks.CancelTask(pb.CancelTaskRequest(task_id="tsk-none"))) == (
        not_found,
        "task_not_found",
    )
    assert await _error(api.ops.ListDispatches(pb.ListDispatchesRequest(page_token="!!"))) == (
        invalid, "page_token_invalid")  # fmt: skip
    assert await _error(api.ops.ListDispatches(pb.ListDispatchesRequest(page_size=501))) == (
        invalid, "page_size_too_large")  # fmt: skip
    assert await _error(
        api.ops.ResolveIndeterminate(pb.ResolveIndeterminateRequest(task_id="t", actor="a"))
    ) == (invalid, "resolution_invalid")
    assert await _error(api.bridge.Claim(bpb.ClaimRequest())) == (invalid, "collector_id_missing")
    assert await _error(api.bridge.Report(bpb.ReportRequest(collector_id="c", task_id="d"))) == (
        invalid, "outcome_invalid")  # fmt: skip
    assert await _error(
        api.bridge.Report(
            bpb.ReportRequest(collector_id="c", task_id="dsp-x", outcome=bpb.REPORT_OUTCOME_SUCCESS)
        )
    ) == (grpc.StatusCode.PERMISSION_DENIED, "not_your_dispatch")
    bad_manifest = bpb.PublishCapabilitiesRequest(
        collector_id="c", providers=[bpb.ProviderCapability(provider="stub", max_concurrency=0)]
    )
    assert await _error(api.bridge.PublishCapabilities(bad_manifest)) == (invalid, "manifest_invalid")


async def test_lease_refusal_names_the_holder(api: Api) -> None:
    await _publish(api, "col-l")
    await api.bridge.Claim(bpb.ClaimRequest(collector_id="col-l"))
    first = await api.tasks.SubmitTask(
        _submit(operation="set", op_class=task_pb2.OP_CLASS_MUTATE_TERMINAL, idempotency_key="m-1")
    )
    status, code = await _error(
        api.tasks.SubmitTask(
            _submit(operation="set", op_class=task_pb2.OP_CLASS_MUTATE_TERMINAL, idempotency_key="m-2")
        )
    )
    assert (status, code) == (grpc.StatusCode.FAILED_PRECONDITION, "device_leased")
    lie = await _error(api.tasks.SubmitTask(_submit(operation="set", idempotency_key="m-3")))
    assert lie == (grpc.StatusCode.FAILED_PRECONDITION, "op_class_mismatch")
    assert first.task.state == task_pb2.TASK_STATE_LEASED


async def test_the_queue_finds_an_indeterminate_task_shows_its_evidence_and_resolves_it(api: Api) -> None:
    await _publish(api, "col-q")
    await api.bridge.Claim(bpb.ClaimRequest(collector_id="col-q"))
    submitted = await api.tasks.SubmitTask(
        _submit(operation="set", op_class=task_pb2.OP_CLASS_MUTATE_TERMINAL, idempotency_key="q-1")
    )
    claimed = await api.bridge.Claim(bpb.ClaimRequest(collector_id="col-q"))
    report = bpb.ReportRequest(
        collector_id="col-q",
        task_id=claimed.dispatch_id,
        outcome=bpb.REPORT_OUTCOME_UNKNOWN,
        error_code="timeout",
        error_message="device stopped answering",
    )
    await api.bridge.Report(signed(report))
    indeterminate = pb.ListDispatchesRequest(task_states=[task_pb2.TASK_STATE_INDETERMINATE])
    [found] = (await api.ops.ListDispatches(indeterminate)).dispatches
    assert (found.dispatch_id, found.task_id) == (claimed.dispatch_id, submitted.task.task_id)
    assert (
        found.task_state == task_pb2.TASK_STATE_INDETERMINATE and found.state == task_pb2.TASK_STATE_UNKNOWN
    )
    assert found.error_code == "timeout" and found.kind == "execute" and found.handed_at.seconds > 0
    unknown = await api.ops.ListDispatches(pb.ListDispatchesRequest(states=[task_pb2.TASK_STATE_UNKNOWN]))
    assert [d.dispatch_id for d in unknown.dispatches] == [claimed.dispatch_id]
    success = await api.ops.ListDispatches(pb.ListDispatchesRequest(states=[task_pb2.TASK_STATE_SUCCESS]))
    assert list(success.dispatches) == []

    shown = await api.ops.GetDispatch(pb.GetDispatchRequest(dispatch_id=claimed.dispatch_id))
    assert shown.task.state == task_pb2.TASK_STATE_INDETERMINATE and shown.task.evidence
    assert [h.to_state for h in shown.task.history][-1] == task_pb2.TASK_STATE_INDETERMINATE
    assert await _error(api.ops.GetDispatch(pb.GetDispatchRequest(dispatch_id="dsp-none"))) == (
        grpc.StatusCode.NOT_FOUND, "dispatch_not_found")  # fmt: skip

    resolved = await api.ops.ResolveIndeterminate(
        pb.ResolveIndeterminateRequest(
            task_id=found.task_id, resolution=pb.RESOLUTION_SUCCESS, note="checked"
        )
    )
    assert resolved.task.state == task_pb2.TASK_STATE_SUCCESS
    async with api.env.router.engine.connect() as conn:
        row = (
            await conn.execute(select(audit_events).where(audit_events.c.subject_id == found.task_id))
        ).one()
    assert row.action == "task.resolve.success" and row.actor.startswith("test-operator (tok_")
    assert await _error(
        api.ops.ResolveIndeterminate(
            pb.ResolveIndeterminateRequest(task_id=found.task_id, resolution=pb.RESOLUTION_FAILED)
        )
    ) == (grpc.StatusCode.FAILED_PRECONDITION, "not_indeterminate")


async def test_watch_is_woken_by_each_committed_transition_not_by_a_timer(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grpc_api, "WATCH_FALLBACK_S", 600.0)  # a missed wake-up would hang the watch
    await _publish(api, "col-w")
    await api.bridge.Claim(bpb.ClaimRequest(collector_id="col-w", claim_seq=1, wait=Duration(nanos=1000)))
    submitted = await api.tasks.SubmitTask(_submit(idempotency_key="w-1"))
    updates: asyncio.Queue[int] = asyncio.Queue()

    async def watch() -> None:
        async for update in api.tasks.WatchTask(pb.WatchTaskRequest(task_id=submitted.task.task_id)):
            await updates.put(update.task.state)

    watcher = asyncio.create_task(watch())
    assert await asyncio.wait_for(updates.get(), 10) == task_pb2.TASK_STATE_LEASED
    claimed = await api.bridge.Claim(
        bpb.ClaimRequest(collector_id="col-w", claim_seq=2, wait=Duration(seconds=1))
    )
    assert await asyncio.wait_for(updates.get(), 10) == task_pb2.TASK_STATE_DISPATCHED
    await api.bridge.Report(
        signed(
            bpb.ReportRequest(
                collector_id="col-w", task_id=claimed.dispatch_id, outcome=bpb.REPORT_OUTCOME_SUCCESS
            )
        )
    )
    assert await asyncio.wait_for(updates.get(), 10) == task_pb2.TASK_STATE_SUCCESS
    await asyncio.wait_for(watcher, 10)
