"""Platform tokens act only for their tenants, on every RPC they may call (real gRPC, PostgreSQL, Redis).

The matrix: a token scoped to tenant A, one scoped to tenant B, one for every tenant, and one
created before tenant scoping existed, against every RPC a platform token can reach.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import update
from versus.access.v1 import access_pb2 as apb
from versus.access.v1 import access_pb2_grpc
from versus.router.v1 import task_pb2, task_router_pb2_grpc, tunnel_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb
from versus.router.v1 import tunnel_pb2 as tpb

from common.access.api_tokens import TokenAuthenticator
from common.access.rbac import Role
from common.db.schema import api_tokens
from common.embedded.process import free_port
from common.error_mapping import GRPC_CODE_METADATA_KEY
from common.grpc.client import aio_channel
from common.grpc.server import GrpcServer
from router.server import registrations
from router.tunnels.broker import TunnelHub
from tests.support.access import mint
from tests.support.router_env import RouterEnv, make_router

pytestmark = pytest.mark.timeout(60)

TENANT_A, SITE_A = "tenant-r", "site-r"  # RouterEnv's own site and tenant
TENANT_B = "tenant-b"


@dataclass
class Scoped:
    env: RouterEnv
    address: str
    tokens: dict[str, str]
    channels: list[grpc.aio.Channel]

    def tasks(self, who: str) -> Any:
        return task_router_pb2_grpc.TaskRouterServiceStub(self._channel(who))

    def tunnels(self, who: str) -> Any:
        return tunnel_pb2_grpc.TunnelServiceStub(self._channel(who))

    def access(self, who: str) -> Any:
        return access_pb2_grpc.AccessServiceStub(self._channel(who))

    def _channel(self, who: str) -> grpc.aio.Channel:
        channel = aio_channel(self.address, self.tokens[who])
        self.channels.append(channel)
        return channel


@pytest.fixture
async def scoped(database_url: str, redis_url: str) -> AsyncIterator[Scoped]:
    router = make_router(database_url, redis_url)
    port = free_port()
    router.tunnels = TunnelHub(router.redis, router.wake)
    server = GrpcServer("router", "127.0.0.1", port, registrations(router), TokenAuthenticator(router.engine))
    await server.start()
    tokens = {
        "a": await mint(router.engine, Role.PLATFORM, "a", tenants=(TENANT_A,)),
        "b": await mint(router.engine, Role.PLATFORM, "b", tenants=(TENANT_B, "tenant-c")),
        "all": await mint(router.engine, Role.PLATFORM, "all"),
        "legacy": await mint(router.engine, Role.PLATFORM, "legacy", tenants=("x",)),
        "admin": await mint(router.engine, Role.COLLECTOR_ADMIN, "admin"),
    }
    async with router.engine.begin() as conn:  # as a token created before migration 0006 looks
        await conn.execute(update(api_tokens).where(api_tokens.c.name == "legacy").values(tenants=None))
    env = RouterEnv(router)
    await env.add_collector("col-a", live=False)
    out = Scoped(env, server.address, tokens, [])
    yield out
    for channel in out.channels:
        await channel.close(None)
    await server.stop(0)
    await router.aclose()


def _deadline() -> Timestamp:
    out = Timestamp()
    out.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=600))
    return out


def _submit(tenant: str, key: str) -> pb.SubmitTaskRequest:
    return pb.SubmitTaskRequest(
        provider="stub", operation="echo", op_class=task_pb2.OP_CLASS_READ, target_ref="dev-1",
        site_id=SITE_A, tenant_id=tenant, params=b"{}", idempotency_key=key, deadline=_deadline(),
    )  # fmt: skip


async def _outcome(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        metadata: Any = exc.trailing_metadata() or ()
        return exc.code(), next((v for k, v in metadata if k == GRPC_CODE_METADATA_KEY), "")
    return grpc.StatusCode.OK, ""


async def _watch(stub: Any, task_id: str) -> None:
    async for _ in stub.WatchTask(pb.WatchTaskRequest(task_id=task_id)):
        return


async def _tunnel(stub: Any, target: tpb.TunnelOpen) -> None:
    async def requests() -> AsyncIterator[tpb.OpenTunnelRequest]:
        yield tpb.OpenTunnelRequest(open=target)
        await asyncio.sleep(30)  # keep our side open; the router answers first

    async for _ in stub.OpenTunnel(requests()):
        return


DENIED = (grpc.StatusCode.PERMISSION_DENIED, "tenant_not_in_scope")
HIDDEN = (grpc.StatusCode.NOT_FOUND, "task_not_found")


@pytest.mark.parametrize("who", ["a", "b", "all", "legacy"])
async def test_every_platform_rpc_keeps_to_the_token_tenants(scoped: Scoped, who: str) -> None:
    allowed = who != "b"
    owner = (await scoped.tasks("a").SubmitTask(_submit(TENANT_A, "k-owner"))).task
    stub = scoped.tasks(who)

    submitted = await _outcome(stub.SubmitTask(_submit(TENANT_A, f"k-{who}")))
    assert submitted == ((grpc.StatusCode.OK, "") if allowed else DENIED)
    got = await _outcome(stub.GetTask(pb.GetTaskRequest(task_id=owner.task_id)))
    assert got == ((grpc.StatusCode.OK, "") if allowed else HIDDEN)
    watched = await _outcome(_watch(stub, owner.task_id))
    assert watched == ((grpc.StatusCode.OK, "") if allowed else HIDDEN)
    # The role matrix still applies on top: the dispatch queue is for operators.
    listed = await _outcome(stub.ListDispatches(pb.ListDispatchesRequest()))
    assert listed[0] == grpc.StatusCode.PERMISSION_DENIED

    by_site = await _outcome(
        _tunnel(
            scoped.tunnels(who), tpb.TunnelOpen(host="10.0.0.1", port=22, site_id=SITE_A, tenant_id=TENANT_A)
        )
    )
    # Allowed callers get past the scope check to the placement answer (the collector is offline).
    assert by_site == ((grpc.StatusCode.FAILED_PRECONDITION, "no_eligible_collector") if allowed else DENIED)
    named = await _outcome(
        _tunnel(scoped.tunnels(who), tpb.TunnelOpen(host="10.0.0.1", port=22, collector_id="col-a"))
    )
    assert named == (
        (grpc.StatusCode.FAILED_PRECONDITION, "collector_not_live")
        if allowed
        else (grpc.StatusCode.PERMISSION_DENIED, "collector_not_in_tenant")
    )

    cancelled = await _outcome(stub.CancelTask(pb.CancelTaskRequest(task_id=owner.task_id)))
    assert cancelled[0] in ((grpc.StatusCode.OK,) if allowed else (HIDDEN[0],))
    state = (await scoped.tasks("admin").GetTask(pb.GetTaskRequest(task_id=owner.task_id))).task.state
    assert (state == task_pb2.TASK_STATE_CANCELLED) is allowed


async def test_idempotency_keys_are_per_tenant(scoped: Scoped) -> None:
    first = await scoped.tasks("a").SubmitTask(_submit(TENANT_A, "shared-key"))
    other = await scoped.tasks("b").SubmitTask(_submit(TENANT_B, "shared-key"))
    again = await scoped.tasks("a").SubmitTask(_submit(TENANT_A, "shared-key"))
    assert not first.existing and not other.existing and again.existing
    assert other.task.task_id != first.task.task_id == again.task.task_id
    assert other.task.tenant_id == TENANT_B


async def test_platform_tokens_must_name_their_tenants(scoped: Scoped) -> None:
    admin = scoped.access("admin")

    def create(role: Any, **kw: Any) -> Any:
        return admin.CreateApiToken(apb.CreateApiTokenRequest(name="m", role=role, **kw))

    assert await _outcome(create(apb.ROLE_PLATFORM)) == (grpc.StatusCode.INVALID_ARGUMENT, "tenants_required")
    assert await _outcome(create(apb.ROLE_VIEWER, tenants=["t"])) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "tenants_not_applicable",
    )
    assert await _outcome(create(apb.ROLE_PLATFORM, tenants=["t"], all_tenants=True)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "tenants_invalid",
    )
    made = await create(apb.ROLE_PLATFORM, tenants=["t2", "t1", "t1"])
    assert list(made.token.tenants) == ["t1", "t2"] and not made.token.all_tenants
    me = await scoped.access("b").WhoAmI(apb.WhoAmIRequest())
    assert list(me.tenants) == [TENANT_B, "tenant-c"] and not me.all_tenants
    everyone = await scoped.access("all").WhoAmI(apb.WhoAmIRequest())
    assert list(everyone.tenants) == [] and everyone.all_tenants
