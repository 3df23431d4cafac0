"""Releases and upgrade targets over real sockets: PublishRelease streams into the TUF repository,
the target rides the claim in the signed config, a supervisor's report is recorded and audited,
and a yanked release leaves the repository (router/releases/publishing.py, router/releases/updates.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import select, update
from versus.fleet.v1 import fleet_pb2 as fpb

from common.access.rbac import Role
from common.db.schema import audit_events, collectors
from common.grpc.client import STREAM_WINDOW_BYTES
from common.trust import signed_doc
from common.trust.keys import KeyPurpose, KeySet
from router.releases.publishing import Releases
from router.releases.update_repo import UpdateRepository
from router.releases.updates import Report, Updates
from tests.integration import test_gateway_collector as gw
from tests.integration.test_fleet import Ops, _code, _connected
from tests.support.access import mint

pytestmark = pytest.mark.timeout(90)
stack = gw.stack
Stack = gw.Stack
ARTIFACT = b"a collector release\n" * 70_000  # over one chunk


@pytest.fixture
async def admin(stack: Stack) -> AsyncIterator[Ops]:
    ops = Ops(stack.grpc_address, await mint(stack.router.engine, Role.COLLECTOR_ADMIN, "alice"))
    yield ops
    await ops.channel.close(None)


@pytest.fixture
def repo(stack: Stack, tmp_path: Path) -> UpdateRepository:
    keys = KeySet.create(KeyPurpose.RELEASE, int(time.time()) - 60)
    repository = UpdateRepository(tmp_path / "updates")
    stack.router.updates = Updates(stack.router.engine, stack.router.wake.publish, soak=dt.timedelta(0))
    stack.router.releases = Releases(stack.router.engine, repository, lambda: keys, stack.router.updates)
    return repository


def _messages(version: str, body: bytes = ARTIFACT, **header: Any) -> Iterable[fpb.PublishReleaseRequest]:
    fields: dict[str, Any] = {
        "version": version, "channel": fpb.CHANNEL_STABLE, "os": "linux", "arch": "x86_64",
        "length": len(body), "sha256": hashlib.sha256(body).hexdigest(), **header,
    }  # fmt: skip
    yield fpb.PublishReleaseRequest(header=fpb.ReleaseHeader(**fields))
    for i in range(0, len(body), 1 << 20):
        yield fpb.PublishReleaseRequest(chunk=body[i : i + (1 << 20)])


async def _refused(admin: Ops, messages: Iterable[fpb.PublishReleaseRequest]) -> str | None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.PublishRelease(iter(messages))
    return _code(info.value)


async def test_publish_checks_what_it_is_given(stack: Stack, admin: Ops, repo: UpdateRepository) -> None:
    body_only = list(_messages("1.0.0"))[1:]
    assert await _refused(admin, body_only) == "release_header_missing"
    assert await _refused(admin, _messages("latest")) == "version_invalid"
    assert await _refused(admin, _messages("1.0.0", length=len(ARTIFACT) - 1)) == "artifact_length_mismatch"
    assert await _refused(admin, _messages("1.0.0", sha256="0" * 64)) == "artifact_sha256_mismatch"
    assert await _refused(admin, _messages("1.0.0", os="Linux OS")) == "os_invalid"
    # Refused at the header while the client still has far more than a flow-control window to
    # write: the server takes the rest before answering, so the client's writes all complete and
    # it reads the refusal - not a failed write, which grpc.aio reports as INTERNAL without a code
    # (common/grpc/uploads.py). Without that, the client's writes stop after about a window.
    large = list(_messages("1.0.0", b"x" * (8 * STREAM_WINDOW_BYTES), os="Linux OS"))
    taken = 0

    def counted() -> Iterable[fpb.PublishReleaseRequest]:
        nonlocal taken
        for message in large:
            yield message
            taken += 1

    assert await _refused(admin, counted()) == "os_invalid"
    assert taken == len(large)
    assert not repo.exists() or repo.released() == {}  # nothing half-published
    published = (await admin.fleet.PublishRelease(iter(_messages("1.0.0", security_fix=True)))).release
    assert (published.version, published.target_name, published.length) == (
        "1.0.0", "versus-collector-1.0.0-linux-x86_64.pex", len(ARTIFACT),
    )  # fmt: skip
    assert published.published_by.startswith("alice")
    assert published.security_fix and published.sha256 == hashlib.sha256(ARTIFACT).hexdigest()
    listed = repo.released()[published.target_name]
    assert (listed.sha256, listed.custom["version"], listed.custom["security_fix"]) == (
        published.sha256, "1.0.0", True,
    )  # fmt: skip
    assert await _refused(admin, _messages("1.0.0")) == "release_exists"
    releases = (await admin.fleet.ListReleases(fpb.ListReleasesRequest())).releases
    assert [r.version for r in releases] == ["1.0.0"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.GetRelease(fpb.GetReleaseRequest(version="9.9.9"))
    assert _code(info.value) == "release_not_found"
    leftovers = list((repo.directory / "incoming").iterdir())
    assert leftovers == [], leftovers


async def test_the_target_rides_the_claim_signed_and_a_rollback_is_recorded(
    stack: Stack, admin: Ops, repo: UpdateRepository
) -> None:
    c = await _connected(stack, "col-up")
    async with stack.router.engine.begin() as conn:
        await conn.execute(update(collectors).where(collectors.c.collector_id == "col-up")
                           .values(os="linux", arch="x86_64"))  # fmt: skip
    await admin.fleet.PublishRelease(iter(_messages("1.1.0")))
    card = (await admin.fleet.GetCollector(fpb.GetCollectorRequest(collector_id="col-up"))).collector.update
    assert (card.latest_version, card.badge, card.policy) == (
        "1.1.0",
        fpb.UPDATE_BADGE_UPDATE_AVAILABLE,
        "manual",
    )
    # The approval reaches a held claim as a new signed config naming the release.
    held = asyncio.create_task(stack.post("/claim", {"session_id": "s-1", "wait_s": gw.HOLD_S}, c))
    await asyncio.sleep(0.3)
    applied = await admin.fleet.ApplyUpdate(fpb.ApplyUpdateRequest(collector_id="col-up"))
    assert applied.collector.update.approved_version == "1.1.0"
    reply = await held
    config = signed_doc.verify(reply.json()["config"], c.dispatch_keys, kind="collector_config",
                               collector_id="col-up", now=int(time.time()))  # fmt: skip
    target = repo.released()["versus-collector-1.1.0-linux-x86_64.pex"]
    assert config["update"] == {"version": "1.1.0", "target": target.name, "sha256": target.sha256,
                                "length": target.length}  # fmt: skip
    # The supervisor's report rides the next claim: recorded once, audited, and the approval used up.
    report = {
        "state": "rolled_back",
        "version": "1.1.0",
        "detail": "did not reach the control plane",
        "at": 1,
    }
    claim = {"session_id": "s-1", "wait_s": 0, "config_version": config["version"], "update_status": report}
    for _ in range(2):
        assert (await stack.post("/claim", claim, c)).status_code in (200, 204)
    card = (await admin.fleet.GetCollector(fpb.GetCollectorRequest(collector_id="col-up"))).collector.update
    assert (card.badge, card.state_version, card.approved_version) == (
        fpb.UPDATE_BADGE_ROLLED_BACK,
        "1.1.0",
        "",
    )
    async with stack.router.engine.connect() as conn:
        audited = (await conn.execute(select(audit_events.c.action).where(
            audit_events.c.subject_id == "col-up", audit_events.c.action.like("collector.update%")
        ))).scalars().all()  # fmt: skip
    assert sorted(audited) == ["collector.update_apply", "collector.update_rolled_back"]
    for bad_status in ({**report, "state": "exploded"}, {**report, "at": 2**63 - 2}):
        assert (await stack.post("/claim", {**claim, "update_status": bad_status}, c)).status_code == 400
    # Past the edge (an old gateway, a direct gRPC caller), a time no datetime holds is the router's now.
    await stack.router.updates.record("col-up", Report("updated", "1.1.0", "", 2**62))
    # Cancelling with nothing approved is refused with its code.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.CancelUpdate(fpb.CancelUpdateRequest(collector_id="col-up"))
    assert _code(info.value) == "update_not_approved"


async def test_a_yanked_release_leaves_the_repository(
    stack: Stack, admin: Ops, repo: UpdateRepository
) -> None:
    await admin.fleet.PublishRelease(iter(_messages("1.0.0")))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.YankRelease(fpb.YankReleaseRequest(version="1.0.0"))
    assert _code(info.value) == "reason_required"
    yanked = (
        await admin.fleet.YankRelease(fpb.YankReleaseRequest(version="1.0.0", reason="bad build"))
    ).releases
    assert [(r.yanked, r.yank_reason) for r in yanked] == [(True, "bad build")]
    assert yanked[0].yanked_by.startswith("alice")
    assert repo.released() == {}
    assert (await admin.fleet.ListReleases(fpb.ListReleasesRequest())).releases == []
    assert len((await admin.fleet.ListReleases(fpb.ListReleasesRequest(include_yanked=True))).releases) == 1
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.fleet.YankRelease(fpb.YankReleaseRequest(version="1.0.0", reason="again"))
    assert _code(info.value) == "release_yanked"


async def test_only_admins_publish(stack: Stack, repo: UpdateRepository) -> None:
    viewer = Ops(stack.grpc_address, await mint(stack.router.engine, Role.VIEWER, "vic"))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await viewer.fleet.PublishRelease(iter(_messages("1.0.0")))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await viewer.channel.close(None)
