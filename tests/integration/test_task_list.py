"""ListTasks over real gRPC and PostgreSQL: tasks in every state, queued ones with their condition,
every filter, keyset pages, bad input refused with its code, and a tenant-scoped token's view."""

from __future__ import annotations

import datetime as dt

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import select
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.access.rbac import Role
from common.db.schema import audit_events
from common.grpc.client import aio_channel
from tests.integration import test_router_grpc
from tests.integration.test_router_grpc import Api, _error, _publish, _submit
from tests.support.access import mint

pytestmark = pytest.mark.timeout(60)
api = test_router_grpc.api  # the router over real gRPC, as those tests have it


def _at(when: dt.datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(when)
    return out


async def _ids(api: Api, **filters: object) -> list[str]:
    reply = await api.ops.ListTasks(pb.ListTasksRequest(**filters))  # type: ignore[arg-type]
    return [t.task_id for t in reply.tasks]


async def test_tasks_in_every_state_newest_first_with_filters_and_pages(api: Api) -> None:
    # No collector at its site: the first task waits, queued, saying why.
    waiting = (
        await api.tasks.SubmitTask(_submit(idempotency_key="q-1", target_ref="dev-q", site_id="site-empty"))
    ).task
    await _publish(api, "col-l")
    await api.bridge.Claim(bpb.ClaimRequest(collector_id="col-l"))
    labelled = (
        await api.tasks.SubmitTask(
            _submit(idempotency_key="l-1", target_ref="dev-l", labels={"change": "CHG-1", "env": "prod"})
        )
    ).task
    other_site = (
        await api.tasks.SubmitTask(_submit(idempotency_key="s-1", site_id="site-other", operation="set"))
    ).task
    more = [(await api.tasks.SubmitTask(_submit(idempotency_key=f"m-{i}"))).task for i in range(3)]

    everything = await _ids(api)
    assert everything == [t.task_id for t in reversed([waiting, labelled, other_site, *more])]
    listed = {t.task_id: t for t in (await api.ops.ListTasks(pb.ListTasksRequest())).tasks}
    assert listed[waiting.task_id].state == task_pb2.TASK_STATE_QUEUED
    assert listed[waiting.task_id].condition == "no_eligible_collector"
    assert not listed[waiting.task_id].history  # GetTask has the history
    assert listed[labelled.task_id].state == task_pb2.TASK_STATE_LEASED

    assert await _ids(api, states=[task_pb2.TASK_STATE_QUEUED]) == [
        t for t in everything if listed[t].state == task_pb2.TASK_STATE_QUEUED
    ]
    assert await _ids(api, site_id="site-other") == [other_site.task_id]
    assert await _ids(api, operation="set") == [other_site.task_id]
    assert await _ids(api, provider="stub") == everything
    assert await _ids(api, provider="none") == []
    assert await _ids(api, target_ref="dev-l") == [labelled.task_id]
    assert await _ids(api, labels={"env": "prod"}) == [labelled.task_id]
    assert await _ids(api, labels={"env": "prod", "change": "CHG-2"}) == []
    assert await _ids(api, tenant_id="tenant-r") == everything
    assert await _ids(api, tenant_id="tenant-x") == []
    now = dt.datetime.now(dt.UTC)
    assert await _ids(api, created_after=_at(now + dt.timedelta(minutes=1))) == []
    assert await _ids(api, created_before=_at(now + dt.timedelta(minutes=1))) == everything
    assert await _ids(api, created_after=_at(labelled.created_at.ToDatetime(dt.UTC))) == everything[:5]

    seen: list[str] = []
    token = ""
    while True:
        page = await api.ops.ListTasks(pb.ListTasksRequest(page_size=2, page_token=token))
        assert len(page.tasks) <= 2
        seen += [t.task_id for t in page.tasks]
        if not (token := page.next_page_token):
            break
    assert seen == everything


async def test_bad_listings_are_refused_with_their_codes(api: Api) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert await _error(api.ops.ListTasks(pb.ListTasksRequest(page_token="!!"))) == (
        invalid, "page_token_invalid")  # fmt: skip
    assert await _error(api.ops.ListTasks(pb.ListTasksRequest(page_size=501))) == (
        invalid, "page_size_too_large")  # fmt: skip
    unknown = pb.ListTasksRequest(states=[99])  # type: ignore[list-item]
    assert await _error(api.ops.ListTasks(unknown)) == (invalid, "state_invalid")
    now = dt.datetime.now(dt.UTC)
    backwards = pb.ListTasksRequest(created_after=_at(now), created_before=_at(now - dt.timedelta(hours=1)))
    assert await _error(api.ops.ListTasks(backwards)) == (invalid, "time_range_invalid")


async def test_a_tenant_scoped_token_lists_its_tenants_tasks_only(api: Api) -> None:
    mine = (await api.tasks.SubmitTask(_submit(idempotency_key="t-1", tenant_id="tenant-a"))).task
    await api.tasks.SubmitTask(_submit(idempotency_key="t-2", tenant_id="tenant-b"))
    engine = api.env.router.engine
    scoped_channel = aio_channel(api.address, await mint(engine, Role.PLATFORM, tenants=("tenant-a",)))
    service_channel = aio_channel(api.address, await mint(engine, Role.SERVICE))
    try:
        scoped = task_router_pb2_grpc.TaskRouterServiceStub(scoped_channel)
        reply = await scoped.ListTasks(pb.ListTasksRequest())
        assert [t.task_id for t in reply.tasks] == [mine.task_id]
        assert not (await scoped.ListTasks(pb.ListTasksRequest(tenant_id="tenant-b"))).tasks
        # An operator sees both; a collector's service token may not list at all.
        assert len((await api.ops.ListTasks(pb.ListTasksRequest())).tasks) == 2
        service = task_router_pb2_grpc.TaskRouterServiceStub(service_channel)
        denied = await _error(service.ListTasks(pb.ListTasksRequest()))
        assert denied[0] == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await scoped_channel.close(None)
        await service_channel.close(None)


async def test_an_operator_retries_a_settled_task_as_a_new_audited_task(api: Api) -> None:
    first = (await api.tasks.SubmitTask(_submit(idempotency_key="r-1", site_id="site-empty"))).task
    in_flight = await _error(
        api.ops.RetryTask(pb.RetryTaskRequest(task_id=first.task_id, idempotency_key="a"))
    )
    assert in_flight == (grpc.StatusCode.FAILED_PRECONDITION, "task_not_settled")
    await api.ops.CancelTask(pb.CancelTaskRequest(task_id=first.task_id, reason="wrong window"))
    asked = pb.RetryTaskRequest(task_id=first.task_id, idempotency_key="again-1", reason="window open")
    again = await api.ops.RetryTask(asked)
    assert not again.existing and again.task.task_id != first.task_id
    assert again.task.labels["versus.retry_of"] == first.task_id
    assert (again.task.target_ref, again.task.state) == (first.target_ref, task_pb2.TASK_STATE_QUEUED)
    repeated = await api.ops.RetryTask(asked)  # a double submit of the console's form
    assert repeated.existing and repeated.task.task_id == again.task.task_id
    async with api.env.router.engine.connect() as conn:
        events = (
            await conn.execute(
                select(audit_events.c.action, audit_events.c.subject_id, audit_events.c.details).where(
                    audit_events.c.action == "task.retry"
                )
            )
        ).all()
    assert [(a, s, d["retry_of"], d["reason"]) for a, s, d in events] == [
        ("task.retry", again.task.task_id, first.task_id, "window open")
    ]
    # Platforms submit their own tasks; retrying is the operator's.
    denied = await _error(
        api.tasks.RetryTask(pb.RetryTaskRequest(task_id=first.task_id, idempotency_key="b"))
    )
    assert denied[0] == grpc.StatusCode.PERMISSION_DENIED
    missing = await _error(api.ops.RetryTask(pb.RetryTaskRequest(task_id=first.task_id)))
    assert missing == (grpc.StatusCode.INVALID_ARGUMENT, "idempotency_key_missing")
