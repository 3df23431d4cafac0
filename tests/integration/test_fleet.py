"""Fleet management over real sockets: gRPC FleetService/AccessService against the real gateway,
router and enrollment stack, with collectors speaking HTTPS to the gateway."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from cryptography import x509
from google.protobuf.json_format import MessageToDict
from prometheus_client import REGISTRY
from sqlalchemy import select, update
from versus.access.v1 import access_pb2, access_pb2_grpc
from versus.fleet.v1 import fleet_pb2 as fpb
from versus.fleet.v1 import fleet_pb2_grpc
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.access.rbac import Role
from common.db.schema import audit_events, collectors
from common.error_mapping import GRPC_CODE_METADATA_KEY
from common.grpc.client import aio_channel
from common.trust import pki, signed_doc
from router.credentials.store import CredentialStore
from router.credentials.vault import MasterKeys
from router.fleet import gauges
from router.server import sample_gauges
from tests.integration import test_gateway_collector as gw
from tests.support.access import mint
from tests.support.pki import csr_pem, p256

pytestmark = pytest.mark.timeout(90)
stack = gw.stack
Stack = gw.Stack


class Ops:
    """Stubs presenting a token of one role."""

    def __init__(self, address: str, token: str):
        self.channel = aio_channel(address, token)
        self.fleet = fleet_pb2_grpc.FleetServiceStub(self.channel)
        self.access = access_pb2_grpc.AccessServiceStub(self.channel)
        self.tasks = task_router_pb2_grpc.TaskRouterServiceStub(self.channel)


@pytest.fixture
async def admin(stack: Stack) -> AsyncIterator[Ops]:
    ops = Ops(stack.grpc_address, await mint(stack.router.engine, Role.COLLECTOR_ADMIN, "alice"))
    yield ops
    await ops.channel.close(None)


def _code(exc: grpc.aio.AioRpcError) -> str | None:
    metadata: Any = exc.trailing_metadata() or ()
    return next((v for k, v in metadata if k == GRPC_CODE_METADATA_KEY), None)


async def _connected(
    stack: Stack, name: str, session: str = "s-1", vault_mode: str = "local"
) -> gw.Collector:
    c = await stack.enroll(name)
    assert (await stack.publish(c)).status_code == 200
    claim = {"wait_s": 0, "session_id": session, "vault_mode": vault_mode}
    assert (await stack.post("/claim", claim, c)).status_code == 204
    return c


async def _show(admin: Ops, cid: str) -> fpb.Collector:
    return (await admin.fleet.GetCollector(fpb.GetCollectorRequest(collector_id=cid))).collector


async def test_list_search_and_detail(stack: Stack, admin: Ops) -> None:
    await _connected(stack, "col-east-1", session="sess-a")
    await stack.enroll("col-west-2")  # enrolled, never connected
    listed = (await admin.fleet.ListCollectors(fpb.ListCollectorsRequest())).collectors
    assert [c.collector_id for c in listed] == ["col-east-1", "col-west-2"]
    assert [c.session_state for c in listed] == [fpb.SESSION_STATE_ACTIVE, fpb.SESSION_STATE_DEAD]
    assert all(c.site_id == stack.site_id and c.status == fpb.COLLECTOR_STATUS_ACTIVE for c in listed)
    found = await admin.fleet.ListCollectors(fpb.ListCollectorsRequest(query="EAST"))
    assert [c.collector_id for c in found.collectors] == ["col-east-1"]
    by_site = await admin.fleet.ListCollectors(fpb.ListCollectorsRequest(query=stack.site_id[:8]))
    assert len(by_site.collectors) == 2
    paged = await admin.fleet.ListCollectors(fpb.ListCollectorsRequest(page_size=1))
    assert paged.next_page_token == "col-east-1"

    c = await _show(admin, "col-east-1")
    assert c.cert_serial and len(c.cert_fingerprint_sha256.split(":")) == 32
    assert c.cert_not_after.ToDatetime(dt.UTC) > dt.datetime.now(dt.UTC) + dt.timedelta(days=89)
    assert c.enrolled_at.seconds > 0
    assert c.vault_mode == fpb.VAULT_MODE_LOCAL
    s = c.session
    assert (s.state, s.session_id, s.transport) == (fpb.SESSION_STATE_ACTIVE, "sess-a", "https")
    assert s.vault_mode == fpb.VAULT_MODE_LOCAL and s.heartbeat_age_s <= 2 and s.established_at.seconds > 0
    [driver] = c.drivers
    assert driver.provider == "stub" and driver.max_concurrency == 4
    assert [(o.name, o.op_class, o.timeout_s) for o in driver.operations] == [
        ("echo", "read", 30),
        ("set", "mutate_terminal", 60),  # the manifest default
    ]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _show(admin, "col-nope")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_list_filters_by_status_session_version_and_driver(stack: Stack, admin: Ops) -> None:
    await _connected(stack, "col-f-live")
    for name in ("col-f-idle", "col-f-revoked", "col-f-expired"):
        await stack.enroll(name)
    async with stack.router.engine.begin() as conn:
        await conn.execute(update(collectors).where(collectors.c.collector_id == "col-f-revoked").values(
            status="revoked"
        ))  # fmt: skip
        await conn.execute(update(collectors).where(collectors.c.collector_id == "col-f-expired").values(
            cert_not_after=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        ))  # fmt: skip

    async def ids(**filters: Any) -> list[str]:
        found, page = [], ""
        while True:  # page by page, one at a time: filtered pages are filled across reads
            reply = await admin.fleet.ListCollectors(
                fpb.ListCollectorsRequest(page_size=1, page_token=page, **filters)
            )
            found += [c.collector_id for c in reply.collectors]
            page = reply.next_page_token
            if not page:
                return found

    assert await ids(status=fpb.COLLECTOR_STATUS_ACTIVE) == ["col-f-idle", "col-f-live"]
    assert await ids(status=fpb.COLLECTOR_STATUS_REVOKED) == ["col-f-revoked"]
    assert await ids(status=fpb.COLLECTOR_STATUS_EXPIRED) == ["col-f-expired"]
    assert await ids(session_state=fpb.SESSION_STATE_ACTIVE) == ["col-f-live"]
    assert await ids(session_state=fpb.SESSION_STATE_DEAD) == ["col-f-expired", "col-f-idle", "col-f-revoked"]
    assert await ids(session_state=fpb.SESSION_STATE_STALE) == []
    await stack.router.redis.zadd("versus:live", {"col-f-idle": time.time() - 100})  # heard 100 s ago
    assert await ids(session_state=fpb.SESSION_STATE_STALE) == ["col-f-idle"]
    assert await ids(session_state=fpb.SESSION_STATE_ACTIVE) == ["col-f-live"]
    await stack.router.redis.zrem("versus:live", "col-f-idle")
    assert await ids(driver="stub") == ["col-f-live"]
    assert await ids(driver="ssh") == []
    running = (await _show(admin, "col-f-live")).update.running_version
    assert running and await ids(agent_version=running, session_state=fpb.SESSION_STATE_ACTIVE) == [
        "col-f-live"
    ]
    assert await ids(agent_version="0.0.0-nope") == []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.ListCollectors(fpb.ListCollectorsRequest(status=99))  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _code(info.value) == "status_invalid"


async def test_certificates_expiring_soon_are_listed_and_the_soonest_is_a_gauge(
    stack: Stack, admin: Ops
) -> None:
    for name in ("col-cert-soon", "col-cert-later", "col-cert-revoked"):
        await stack.enroll(name)
    soon = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=3)
    async with stack.router.engine.begin() as conn:
        for cid, status in (("col-cert-soon", "active"), ("col-cert-revoked", "revoked")):
            await conn.execute(
                update(collectors)
                .where(collectors.c.collector_id == cid)
                .values(cert_not_after=soon, status=status)
            )
    request = fpb.ListCollectorsRequest()
    request.expiring_within.FromTimedelta(dt.timedelta(days=14))
    expiring = await admin.fleet.ListCollectors(request)
    assert [c.collector_id for c in expiring.collectors] == ["col-cert-soon"]  # revoked ones do not matter
    request.expiring_within.FromTimedelta(dt.timedelta(days=-1))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.ListCollectors(request)
    assert _code(info.value) == "expiring_within_invalid"

    gauges.GAUGES.sample = gauges.FleetSample()  # as in a router that has not sampled yet
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.GetFleetHealth(fpb.GetFleetHealthRequest())
    assert (info.value.code(), _code(info.value)) == (grpc.StatusCode.UNAVAILABLE, "fleet_not_sampled")
    await sample_gauges(stack.router)
    gauge = REGISTRY.get_sample_value("versus_collector_cert_soonest_expiry_timestamp_seconds")
    assert gauge == soon.timestamp()
    # The overview answers from that sample: the soon-expiring certificate, its site, the day's buckets.
    health = await admin.fleet.GetFleetHealth(fpb.GetFleetHealthRequest())
    assert [(e.collector_id, e.not_after.ToDatetime(dt.UTC)) for e in health.expiring] == [
        ("col-cert-soon", soon)
    ]
    assert health.expiring_count == 1
    assert sum(c.count for s in health.sites for c in s.statuses) == 3
    assert (len(health.last_hour), len(health.last_day)) == (12, 24)
    assert abs(health.sampled_at.ToDatetime(dt.UTC).timestamp() - time.time()) < 30


async def test_probe_thresholds_follow_the_heartbeat_age(stack: Stack, admin: Ops) -> None:
    await _connected(stack, "col-p")
    request = fpb.ProbeCollectorRequest(collector_id="col-p")
    seen = []
    for offset in (0, 59, 61, 89, 91, 179, 181):
        stack.clock.offset = offset
        probe = await admin.fleet.ProbeCollector(request)
        seen.append((offset, probe.reachable, fpb.SessionState.Name(probe.session_state)))
        assert abs(probe.heartbeat_age_s - offset) <= 2
    assert seen == [
        (0, True, "SESSION_STATE_ACTIVE"),
        (59, True, "SESSION_STATE_ACTIVE"),
        (61, True, "SESSION_STATE_STALE"),
        (89, True, "SESSION_STATE_STALE"),
        (91, False, "SESSION_STATE_STALE"),
        (179, False, "SESSION_STATE_STALE"),
        (181, False, "SESSION_STATE_DEAD"),
    ]
    await stack.enroll("col-never")
    never = await admin.fleet.ProbeCollector(fpb.ProbeCollectorRequest(collector_id="col-never"))
    assert not never.reachable and not never.HasField("heartbeat_age_s")
    assert never.session_state == fpb.SESSION_STATE_DEAD


async def test_drain_while_a_task_runs_then_undrain(stack: Stack, admin: Ops) -> None:
    c = await _connected(stack, "col-d")
    first = await stack.submit("drain-1")
    claimed = await stack.post("/claim", {"claim_seq": 1, "wait_s": 1}, c)
    assert claimed.status_code == 200
    dispatch_id = claimed.json()["dispatch_id"]

    drained = (await admin.fleet.DrainCollector(fpb.DrainCollectorRequest(collector_id="col-d"))).collector
    assert drained.drained and drained.session_state == fpb.SESSION_STATE_DRAINING
    assert drained.queue_depth == 1
    second = await stack.submit("drain-2")
    assert second.task.state == task_pb2.TASK_STATE_QUEUED  # not routed to a drained collector
    # The in-flight task finishes normally.
    report = {"task_id": dispatch_id, "outcome": "success", "result_b64": ""}
    assert (await stack.post("/report", report, c)).status_code == 200
    done = await stack.tasks.GetTask(pb.GetTaskRequest(task_id=first.task.task_id))
    assert done.task.state == task_pb2.TASK_STATE_SUCCESS
    idle = await stack.post("/claim", {"claim_seq": 2, "wait_s": 0.5}, c)
    assert idle.status_code == 204

    restored = (
        await admin.fleet.UndrainCollector(fpb.UndrainCollectorRequest(collector_id="col-d"))
    ).collector
    assert not restored.drained and restored.session_state == fpb.SESSION_STATE_ACTIVE
    again = await stack.post("/claim", {"claim_seq": 3, "wait_s": 2}, c)
    assert again.status_code == 200, again.text
    queued = await stack.tasks.GetTask(pb.GetTaskRequest(task_id=second.task.task_id))
    assert queued.task.state == task_pb2.TASK_STATE_DISPATCHED


async def test_revoke_while_a_claim_is_held(stack: Stack, admin: Ops) -> None:
    c = await _connected(stack, "col-r")
    held = asyncio.create_task(stack.post("/claim", {"claim_seq": 1, "wait_s": gw.HOLD_S}, c))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    revoked = await admin.fleet.RevokeCollector(
        fpb.RevokeCollectorRequest(collector_id="col-r", reason="stolen")
    )
    assert revoked.collector.status == fpb.COLLECTOR_STATUS_REVOKED
    reply = await held
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "collector_revoked"
    assert time.monotonic() - started < gw.HOLD_S - 1  # woken, not timed out
    nxt = await stack.post("/claim", {"claim_seq": 2, "wait_s": 0}, c)
    assert nxt.status_code == 401
    # No undo: approving or revoking again changes nothing.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.ApproveCollector(fpb.ApproveCollectorRequest(collector_id="col-r"))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (await _show(admin, "col-r")).session_state == fpb.SESSION_STATE_DEAD


async def test_revoke_re_places_work_leased_to_the_collector(stack: Stack, admin: Ops) -> None:
    await _connected(stack, "col-a1")
    submitted = await stack.submit("lease-1")
    assert submitted.task.state == task_pb2.TASK_STATE_LEASED
    await admin.fleet.RevokeCollector(fpb.RevokeCollectorRequest(collector_id="col-a1"))
    task = (await stack.tasks.GetTask(pb.GetTaskRequest(task_id=submitted.task.task_id))).task
    assert task.state == task_pb2.TASK_STATE_QUEUED
    assert any("revoked" in h.reason for h in task.history)


async def test_a_second_session_supersedes_the_first(stack: Stack, admin: Ops) -> None:
    c = await _connected(stack, "col-s", session="first")
    held = asyncio.create_task(stack.post("/claim", {"session_id": "first", "wait_s": gw.HOLD_S}, c))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    second = await stack.post("/claim", {"session_id": "second", "wait_s": 0}, c)
    assert second.status_code == 204
    old = await held
    assert old.status_code == 409 and old.json()["error"]["code"] == "session_superseded"
    assert time.monotonic() - started < gw.HOLD_S - 1
    retry = await stack.post("/claim", {"session_id": "first", "wait_s": 0}, c)
    assert retry.status_code == 409
    assert (await stack.post("/claim", {"session_id": "second", "wait_s": 0}, c)).status_code == 204
    assert (await _show(admin, "col-s")).session.session_id == "second"


async def test_an_expired_certificate_makes_the_collector_expired(stack: Stack, admin: Ops) -> None:
    c = await _connected(stack, "col-x")
    async with stack.router.engine.begin() as conn:
        await conn.execute(
            update(collectors)
            .where(collectors.c.collector_id == "col-x")
            .values(cert_not_after=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
        )
    assert (await _show(admin, "col-x")).status == fpb.COLLECTOR_STATUS_EXPIRED
    refused = await stack.post("/claim", {"wait_s": 0}, c)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "certificate_expired"


async def test_approve_and_deny_pending_collectors(stack: Stack, admin: Ops) -> None:
    for name in ("col-pa", "col-pd"):
        issued = await stack.service.issue_token(
            stack.site_id, max_uses=1, ttl_seconds=600, approval_mode="manual"
        )
        reply = await stack.post("/enroll", {"token": issued.plaintext, "csr_pem": csr_pem(p256(), name)})
        assert reply.json()["status"] == "pending"
    approved = await admin.fleet.ApproveCollector(fpb.ApproveCollectorRequest(collector_id="col-pa"))
    assert approved.collector.status == fpb.COLLECTOR_STATUS_ACTIVE
    denied = await admin.fleet.DenyCollector(
        fpb.DenyCollectorRequest(collector_id="col-pd", reason="unknown host")
    )
    assert denied.collector.status == fpb.COLLECTOR_STATUS_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.ApproveCollector(fpb.ApproveCollectorRequest(collector_id="col-pd"))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _code(info.value) == "collector_wrong_status"
    # The enrollment service made the change, as the operator who asked (the token was forwarded).
    async with stack.router.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(audit_events.c.service, audit_events.c.actor, audit_events.c.action)
                .where(audit_events.c.subject_id.in_(["col-pa", "col-pd"]))
                .where(audit_events.c.action.in_(["collector.active", "collector.denied"]))
            )
        ).all()
    assert sorted((service, action) for service, _, action in rows) == [
        ("enrollment", "collector.active"),
        ("enrollment", "collector.denied"),
    ]
    assert all(re.fullmatch(r"alice \(tok_[0-9a-f]+\)", actor) for _, actor, _ in rows), rows


async def test_a_viewer_cannot_change_status_through_the_router(stack: Stack) -> None:
    viewer = Ops(stack.grpc_address, await mint(stack.router.engine, Role.VIEWER, "vic"))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await viewer.fleet.RevokeCollector(fpb.RevokeCollectorRequest(collector_id="nobody"))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await viewer.channel.close(None)


async def test_vault_mode_switch_reaches_a_held_claim(stack: Stack, admin: Ops) -> None:
    c = await _connected(stack, "col-v")
    request = fpb.SetVaultModeRequest(collector_id="col-v", vault_mode=fpb.VAULT_MODE_EXTERNAL)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.SetVaultMode(request)
    assert _code(info.value) == "vault_integration_required"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.SetVaultMode(
            fpb.SetVaultModeRequest(
                collector_id="col-v", vault_mode=fpb.VAULT_MODE_EXTERNAL, integration_id="vi_nope"
            )
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    integration = (
        await admin.fleet.CreateVaultIntegration(
            fpb.CreateVaultIntegrationRequest(
                name="corp-vault", address="https://vault.corp:8200", role_id="role-1", kv_mount="secret"
            )
        )
    ).integration
    held = asyncio.create_task(
        stack.post("/claim", {"session_id": "s-1", "vault_mode": "local", "wait_s": gw.HOLD_S}, c)
    )
    await asyncio.sleep(0.3)
    request.integration_id = integration.integration_id
    # Mode C needs the collector's AppRole secret id (tests/integration/test_vault_mode_c.py).
    stack.router.credential_store = CredentialStore(stack.router.engine, MasterKeys("mk", {"mk": bytes(32)}))
    request.secret_id = "hvs.wrapping-token"
    saved = (await admin.fleet.SetVaultMode(request)).collector
    assert saved.vault_mode == fpb.VAULT_MODE_EXTERNAL
    assert saved.session.vault_mode == fpb.VAULT_MODE_LOCAL  # the running process has not restarted yet
    reply = await held
    assert reply.status_code == 200
    # The new config arrives signed with a dispatch key the collector pinned at enrollment.
    config = signed_doc.verify(
        reply.json()["config"],
        c.dispatch_keys,
        kind="collector_config",
        collector_id="col-v",
        now=int(time.time()),
    )
    assert (config["version"], config["vault_mode"]) == (1, "external")
    assert {k: v for k, v in config["vault"].items() if k != "secret"} == {
        "integration_id": integration.integration_id,
        "address": "https://vault.corp:8200",
        "role_id": "role-1",
        "kv_mount": "secret",
        "path_prefix": "versus",
        "ca_pem": "",
        "secret_id_delivery": "wrapped",
    }
    assert config["vault"]["secret"]["version"] == 1
    # The restarted process (new session, new config) claims normally and is shown running it.
    again = {"session_id": "s-2", "vault_mode": "external", "config_version": 1, "wait_s": 0}
    ok = await stack.post("/claim", again, c)
    assert ok.status_code == 204
    assert (await _show(admin, "col-v")).session.vault_mode == fpb.VAULT_MODE_EXTERNAL


async def test_a_collector_behind_on_the_trust_bundle_gets_it_signed_and_operators_see_its_issuer(
    stack: Stack, admin: Ops
) -> None:
    c = await _connected(stack, "col-t")
    assert stack.router.trust is not None
    store = stack.router.trust.bundles.store
    assert (await _show(admin, "col-t")).cert_issuer == store.load().active["collector"]
    holding = {"session_id": "s-1", "key_versions": {"trust": 1}, "wait_s": 0}
    assert (await stack.post("/claim", holding, c)).status_code == 204
    # Not naming a version (a collector from before in-band bundles) is left alone.
    assert (await stack.post("/claim", {"session_id": "s-1", "wait_s": 0}, c)).status_code == 204

    old_gateway = store.load().active["gateway"]
    store.rotate("gateway")
    reply = await stack.post("/claim", holding, c)
    assert reply.status_code == 200
    bundle = signed_doc.verify(
        reply.json()["trust"], c.dispatch_keys, kind="ca_bundle", collector_id="col-t", now=int(time.time())
    )
    assert bundle["version"] == 2
    assert bundle["collector_active"] == store.load().active["collector"]
    gateway_ids = {pki.ca_id(x509.load_pem_x509_certificate(p.encode())) for p in bundle["gateway_cas"]}
    assert old_gateway in gateway_ids and len(gateway_ids) == 2
    # Holding it: work as usual again, and operators see which version the process holds.
    caught_up = {"session_id": "s-1", "key_versions": {"trust": 2}, "wait_s": 0}
    assert (await stack.post("/claim", caught_up, c)).status_code == 204
    assert (await _show(admin, "col-t")).session.key_versions["trust"] == 2


async def test_every_accepted_action_is_audited_with_the_caller(stack: Stack, admin: Ops) -> None:
    await _connected(stack, "col-au")
    fleet = admin.fleet
    await fleet.DrainCollector(fpb.DrainCollectorRequest(collector_id="col-au"))
    await fleet.UndrainCollector(fpb.UndrainCollectorRequest(collector_id="col-au"))
    await fleet.SetVaultMode(
        fpb.SetVaultModeRequest(collector_id="col-au", vault_mode=fpb.VAULT_MODE_CLOUD_RELAYED)
    )
    await fleet.RevokeCollector(fpb.RevokeCollectorRequest(collector_id="col-au", reason="rotate"))
    integration = await fleet.CreateVaultIntegration(
        fpb.CreateVaultIntegrationRequest(name="v", address="https://v:8200", role_id="r", kv_mount="kv")
    )
    created = await admin.access.CreateApiToken(
        access_pb2.CreateApiTokenRequest(name="bot", role=access_pb2.ROLE_VIEWER)
    )
    await admin.access.RevokeApiToken(access_pb2.RevokeApiTokenRequest(token_id=created.token.token_id))
    events = (await admin.access.ListAuditEvents(access_pb2.ListAuditEventsRequest())).events
    mine = [(e.action, e.subject_id) for e in events if e.actor.startswith("alice (")]
    assert mine == [
        ("api_token.revoke", created.token.token_id),
        ("api_token.create", created.token.token_id),
        ("vault_integration.create", integration.integration.integration_id),
        ("collector.revoked", "col-au"),
        ("collector.vault_mode", "col-au"),
        ("collector.undrain", "col-au"),
        ("collector.drain", "col-au"),
    ]
    vault = MessageToDict(next(e for e in events if e.action == "collector.vault_mode").details)
    assert vault["before"] == {"vault_mode": "local", "vault_integration_id": None, "vault_secret_version": 0}
    assert vault["after"] == {
        "vault_mode": "relayed",
        "vault_integration_id": None,
        "vault_secret_version": 0,
    }
    revoke = MessageToDict(next(e for e in events if e.action == "collector.revoked").details)
    assert revoke["reason"] == "rotate" and revoke["before"] == {"status": "active"}
    filtered = await admin.access.ListAuditEvents(
        access_pb2.ListAuditEventsRequest(subject_id="col-au", action_prefix="collector.d", page_size=1)
    )
    assert [e.action for e in filtered.events] == ["collector.drain"] and not filtered.next_page_token


async def test_a_revoked_api_token_stops_working(stack: Stack, admin: Ops) -> None:
    created = await admin.access.CreateApiToken(
        access_pb2.CreateApiTokenRequest(name="temp", role=access_pb2.ROLE_VIEWER)
    )
    viewer = Ops(stack.grpc_address, created.plaintext)
    who = await viewer.access.WhoAmI(access_pb2.WhoAmIRequest())
    assert (who.name, who.role) == ("temp", access_pb2.ROLE_VIEWER)
    await admin.access.RevokeApiToken(access_pb2.RevokeApiTokenRequest(token_id=created.token.token_id))
    deadline = time.monotonic() + 8  # the positive cache lives 5 s
    while True:
        try:
            await viewer.access.WhoAmI(access_pb2.WhoAmIRequest())
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
            break
        assert time.monotonic() < deadline, "revoked token still accepted"
        await asyncio.sleep(0.25)
    await viewer.channel.close(None)
    listed = (await admin.access.ListApiTokens(access_pb2.ListApiTokensRequest())).tokens
    assert next(t for t in listed if t.name == "temp").revoked_at.seconds > 0
    assert all(not t.display_prefix.endswith(created.plaintext[-8:]) for t in listed)


async def test_revoke_closes_an_idle_control_socket_without_waiting_for_a_frame(
    stack: Stack, admin: Ops
) -> None:
    import websockets

    c = await _connected(stack, "col-wsr")
    async with await gw._ws(stack, c) as ws:
        await ws.send(json.dumps({"v": 1, "id": "c1", "type": "claim", "body": {"wait_s": gw.HOLD_S}}))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await admin.fleet.RevokeCollector(fpb.RevokeCollectorRequest(collector_id="col-wsr"))
        frames = []
        with pytest.raises(websockets.ConnectionClosed) as closed:
            # The held claim may answer 401 first; then the socket closes.
            frames.extend([json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(2)])
        assert all(frame["status"] == 401 for frame in frames)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4401, "collector_revoked")
        assert time.monotonic() - started < 2 * gw.REVOCATION_CHECK_S + 1


async def test_approve_and_deny_are_audited_with_the_caller(stack: Stack, admin: Ops) -> None:
    for name in ("col-qa", "col-qd"):
        issued = await stack.service.issue_token(
            stack.site_id, max_uses=1, ttl_seconds=600, approval_mode="manual"
        )
        await stack.post("/enroll", {"token": issued.plaintext, "csr_pem": csr_pem(p256(), name)})
    await admin.fleet.ApproveCollector(fpb.ApproveCollectorRequest(collector_id="col-qa"))
    await admin.fleet.DenyCollector(fpb.DenyCollectorRequest(collector_id="col-qd", reason="not ours"))
    events = (
        await admin.access.ListAuditEvents(access_pb2.ListAuditEventsRequest(action_prefix="collector."))
    ).events
    got = {
        (e.action, e.subject_id): MessageToDict(e.details) for e in events if e.actor.startswith("alice (")
    }
    assert got[("collector.active", "col-qa")]["after"] == {"status": "active"}
    assert got[("collector.denied", "col-qd")] == {
        "reason": "not ours",
        "before": {"status": "pending"},
        "after": {"status": "denied"},
    }


async def test_a_revoke_broadcast_closes_sockets_without_waiting_for_the_periodic_check(
    stack: Stack, admin: Ops
) -> None:
    import websockets

    stack.app.state.revocation_check_s = 600.0  # only the broadcast can close the socket in time
    c = await _connected(stack, "col-bc")
    async with await gw._ws(stack, c) as ws:
        await asyncio.sleep(0.3)
        await admin.fleet.RevokeCollector(fpb.RevokeCollectorRequest(collector_id="col-bc"))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4401, "collector_revoked")
