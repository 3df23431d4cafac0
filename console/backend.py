"""The console's only way to the fleet: gRPC calls to the router and the enrollment service,
each carrying the signed-in operator's API token. Answers are converted here into plain view
dataclasses (:mod:`console.views`), so templates never see protobuf messages.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, BinaryIO, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict
from versus.access.v1 import access_pb2, access_pb2_grpc
from versus.enrollment.v1 import enrollment_pb2, enrollment_pb2_grpc
from versus.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from versus.router.v1 import task_router_pb2, task_router_pb2_grpc

from common.errors import InvalidArgument
from common.grpc.client import aio_plain_channel
from common.grpc.headers import AUTHORIZATION_HEADER
from common.grpc.pb_struct import integral
from console.audit_views import AuditFilters
from console.queue_views import (
    OUTCOMES,
    RESOLUTIONS,
    DispatchPage,
    DispatchView,
    TaskView,
    dispatch_view,
    task_view,
)
from console.release_views import CHANNELS as RELEASE_CHANNELS
from console.release_views import Bundle, ReleaseView, Upload, bundle, release_view
from console.site_views import (
    APPROVALS,
    CHANNELS,
    POLICIES,
    IssuedToken,
    SiteView,
    TokenView,
    site_view,
    token_view,
)
from console.task_backend import TaskCalls, rpc_error
from console.views import (
    SESSION,
    STATUS,
    VAULT_NAME,
    AuditEntry,
    AuditPage,
    CollectorFilters,
    CollectorPage,
    CollectorView,
    Identity,
    collector_view,
    timestamp,
)

T = TypeVar("T")
TIMEOUT_S = 10.0
PAGE_SIZE = 50
# Site names are looked up once per operator this often, at most this many (beyond it ids show).
NAMES_TTL_S = 30.0
NAMES_RETRY_S = 2.0
DOWNLOAD_TIMEOUT_S = 600.0
MAX_NAMES = 10_000
MAX_NAME_CACHES = 200

_ROLES = {
    access_pb2.ROLE_VIEWER: "viewer",
    access_pb2.ROLE_OPERATOR: "operator",
    access_pb2.ROLE_COLLECTOR_ADMIN: "collector-admin",
    access_pb2.ROLE_PLATFORM: "platform",
    access_pb2.ROLE_SERVICE: "service",
}


class Backend(TaskCalls):
    """Channels to the router and the enrollment service, shared by every operator's calls."""

    def __init__(self, router_address: str, enrollment_address: str):
        self.router_address = router_address
        self.enrollment_address = enrollment_address
        self._router = aio_plain_channel(router_address)
        self._fleet = fleet_pb2_grpc.FleetServiceStub(self._router)
        self._access = access_pb2_grpc.AccessServiceStub(self._router)
        self._tasks = task_router_pb2_grpc.TaskRouterServiceStub(self._router)
        self._enrollment_channel = aio_plain_channel(enrollment_address)
        self._enroll = enrollment_pb2_grpc.EnrollmentServiceStub(self._enrollment_channel)
        # API token -> (expiry on the monotonic clock, site names): per operator, as RBAC decides.
        self._names: dict[str, tuple[float, dict[str, str]]] = {}

    async def close(self) -> None:
        await self._router.close(None)
        await self._enrollment_channel.close(None)

    async def _call(
        self, method: Callable[..., Awaitable[T]], request: Any, token: str, address: str = "",
        timeout_s: float = TIMEOUT_S,
    ) -> T:  # fmt: skip
        """One call as the operator (``request`` a message, or an async iterator of them for a
        client stream); failures come back as the service's domain error."""
        try:
            return await method(
                request, timeout=timeout_s, metadata=((AUTHORIZATION_HEADER, f"Bearer {token}"),)
            )
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, address or self.router_address) from None

    async def whoami(self, token: str) -> Identity:
        reply = await self._call(self._access.WhoAmI, access_pb2.WhoAmIRequest(), token)
        tenants = ("*",) if reply.all_tenants else tuple(reply.tenants)
        return Identity(reply.name, _ROLES.get(reply.role, "unknown"), tenants)

    async def collectors(self, token: str, filters: CollectorFilters, page_token: str) -> CollectorPage:
        request = fleet_pb2.ListCollectorsRequest(
            query=filters.q, site_id=filters.site, page_size=PAGE_SIZE, page_token=page_token,
            status=_number(STATUS, filters.status), session_state=_number(SESSION, filters.session),
            agent_version=filters.version, driver=filters.driver, outdated=filters.outdated == "1",
        )  # fmt: skip
        reply = await self._call(self._fleet.ListCollectors, request, token)
        return CollectorPage(
            [collector_view(c) for c in reply.collectors], reply.next_page_token, reply.outdated_count
        )

    async def collector(self, token: str, collector_id: str) -> CollectorView:
        reply = await self._call(
            self._fleet.GetCollector, fleet_pb2.GetCollectorRequest(collector_id=collector_id), token
        )
        return collector_view(reply.collector)

    async def act(self, token: str, action: str, collector_id: str, reason: str = "") -> tuple[str, bool]:
        """Probe, drain, undrain or revoke; the probe's result to show (empty for the others) and
        whether it is good news (an unreachable collector is shown as a problem)."""
        if action == "probe":
            probe = await self._call(
                self._fleet.ProbeCollector, fleet_pb2.ProbeCollectorRequest(collector_id=collector_id), token
            )
            age = f"{probe.heartbeat_age_s} s ago" if probe.HasField("heartbeat_age_s") else "never"
            verdict = "reachable" if probe.reachable else "not reachable"
            return (
                f"Probe: {verdict} (last heartbeat {age}, queue depth {probe.queue_depth}).",
                probe.reachable,
            )
        fleet = self._fleet
        calls: dict[str, tuple[Callable[..., Awaitable[Any]], Any]] = {
            "approve": (fleet.ApproveCollector, fleet_pb2.ApproveCollectorRequest(collector_id=collector_id)),
            "deny": (
                fleet.DenyCollector,
                fleet_pb2.DenyCollectorRequest(collector_id=collector_id, reason=reason),
            ),
            "apply_update": (fleet.ApplyUpdate, fleet_pb2.ApplyUpdateRequest(collector_id=collector_id)),
            "cancel_update": (fleet.CancelUpdate, fleet_pb2.CancelUpdateRequest(collector_id=collector_id)),
            "drain": (fleet.DrainCollector, fleet_pb2.DrainCollectorRequest(collector_id=collector_id)),
            "undrain": (fleet.UndrainCollector, fleet_pb2.UndrainCollectorRequest(collector_id=collector_id)),
            "revoke": (
                fleet.RevokeCollector,
                fleet_pb2.RevokeCollectorRequest(collector_id=collector_id, reason=reason),
            ),
        }
        if action in calls:
            method, request = calls[action]
            await self._call(method, request, token)
            return "", True
        raise ValueError(action)

    async def set_vault(
        self, token: str, collector_id: str, mode: str, integration_id: str, secret_id: str
    ) -> None:
        """Switch the collector's credential vault mode (it restarts into it: docs/vault.md)."""
        number = _number(VAULT_NAME, mode)
        if not number:
            raise InvalidArgument(f"no vault mode {mode!r}", code="vault_mode_invalid")
        request = fleet_pb2.SetVaultModeRequest(
            collector_id=collector_id, vault_mode=number, integration_id=integration_id, secret_id=secret_id
        )
        await self._call(self._fleet.SetVaultMode, request, token)

    # --- releases -------------------------------------------------------------------------------
    async def releases(self, token: str) -> list[ReleaseView]:
        """Every release, yanked ones too, newest first."""
        request = fleet_pb2.ListReleasesRequest(include_yanked=True)
        reply = await self._call(self._fleet.ListReleases, request, token)
        return [release_view(r) for r in reply.releases]

    async def behind(self, token: str) -> int:
        """Active collectors behind the latest release on their site's channel (all pages)."""
        request = fleet_pb2.ListCollectorsRequest(page_size=1)
        return int((await self._call(self._fleet.ListCollectors, request, token)).outdated_count)

    async def yank(self, token: str, version: str, reason: str) -> None:
        request = fleet_pb2.YankReleaseRequest(version=version, reason=reason)
        await self._call(self._fleet.YankRelease, request, token)

    async def publish(self, token: str, upload: Upload, artifact: BinaryIO, length: int, sha256: str) -> None:
        """Stream the release to the router: its header, then the artifact in 1 MiB messages."""
        header = fleet_pb2.ReleaseHeader(
            version=upload.version, channel=RELEASE_CHANNELS[upload.channel],
            security_fix=upload.security_fix, os=upload.os, arch=upload.arch, notes=upload.notes,
            length=length, sha256=sha256, sbom=upload.sbom,
        )  # fmt: skip

        async def messages() -> AsyncIterator[fleet_pb2.PublishReleaseRequest]:
            yield fleet_pb2.PublishReleaseRequest(header=header)
            while block := await asyncio.to_thread(artifact.read, 1 << 20):
                yield fleet_pb2.PublishReleaseRequest(chunk=block)

        await self._call(self._fleet.PublishRelease, messages(), token, timeout_s=60.0 + length / (1 << 20))

    async def audit(
        self, token: str, f: AuditFilters, page_token: str, page_size: int = PAGE_SIZE
    ) -> AuditPage:
        request = access_pb2.ListAuditEventsRequest(
            subject_id=f.subject, actor=f.actor, action_prefix=f.action, page_size=page_size,
            page_token=page_token,
        )  # fmt: skip
        since, until = f.window()
        if since is not None:
            request.since.FromDatetime(since)
        if until is not None:
            request.until.FromDatetime(until)
        reply = await self._call(self._access.ListAuditEvents, request, token)
        return AuditPage(
            [
                AuditEntry(
                    timestamp(e.at),
                    e.actor,
                    e.action,
                    e.subject_type,
                    e.subject_id,
                    json.dumps(integral(MessageToDict(e.details)), sort_keys=True, ensure_ascii=False),
                )
                for e in reply.events
            ],
            reply.next_page_token,
        )

    # --- sites and enrollment tokens (the enrollment service) --------------------------------------
    async def _enrollment(self, method: Callable[..., Awaitable[T]], request: Any, token: str) -> T:
        return await self._call(method, request, token, self.enrollment_address)

    async def vault_integrations(self, token: str) -> list[fleet_pb2.VaultIntegration]:
        reply = await self._call(
            self._fleet.ListVaultIntegrations, fleet_pb2.ListVaultIntegrationsRequest(), token
        )
        return list(reply.integrations)

    async def create_vault_integration(
        self, token: str, request: fleet_pb2.CreateVaultIntegrationRequest
    ) -> fleet_pb2.VaultIntegration:
        reply = await self._call(self._fleet.CreateVaultIntegration, request, token)
        made: fleet_pb2.VaultIntegration = reply.integration
        return made

    async def releases_for_tools(self, token: str) -> tuple[list[Bundle], str, str]:
        """Published (not yanked) artifacts, the update repository's address and the release key id."""
        reply = await self._call(self._fleet.ListReleases, fleet_pb2.ListReleasesRequest(), token)
        return [bundle(r) for r in reply.releases], reply.manifest_url, reply.update_pubkey

    async def download_release(
        self, token: str, version: str, os_name: str, arch: str
    ) -> AsyncIterator[tuple[str, int, bytes]]:
        """A release artifact as (name, length, bytes) pieces; the name and length come with the first."""
        request = fleet_pb2.DownloadReleaseRequest(version=version, os=os_name, arch=arch)
        call = self._fleet.DownloadRelease(
            request, timeout=DOWNLOAD_TIMEOUT_S, metadata=((AUTHORIZATION_HEADER, f"Bearer {token}"),)
        )
        name, length = "", 0
        try:
            async for piece in call:
                name, length = piece.target_name or name, piece.length or length
                yield name, length, bytes(piece.data)
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, self.router_address) from None

    async def fleet_health(self, token: str) -> fleet_pb2.GetFleetHealthResponse:
        """The overview's numbers (console/overview_views.py converts them)."""
        reply: fleet_pb2.GetFleetHealthResponse = await self._call(
            self._fleet.GetFleetHealth, fleet_pb2.GetFleetHealthRequest(), token
        )
        return reply

    async def site_names(self, token: str, need: Iterable[str] = ()) -> dict[str, str]:
        """Every site's name by id, as this operator may list them, kept :data:`NAMES_TTL_S`: pages
        show names, not ids, without a lookup each. A site in ``need`` the copy does not know yet
        (made since) has it read again, at most every :data:`NAMES_RETRY_S`."""
        now = time.monotonic()
        cached = self._names.get(token)
        if cached is not None and cached[0] > now:
            fresh_enough = cached[0] - NAMES_TTL_S + NAMES_RETRY_S > now
            if fresh_enough or all(site in cached[1] for site in need):
                return cached[1]
        names: dict[str, str] = {}
        page = ""
        while len(names) < MAX_NAMES:
            request = enrollment_pb2.ListSitesRequest(page_size=500, page_token=page)
            reply = await self._enrollment(self._enroll.ListSites, request, token)
            names.update({s.site_id: s.name for s in reply.sites})
            page = reply.next_page_token
            if not page:
                break
        if len(self._names) >= MAX_NAME_CACHES:
            self._names.clear()
        self._names[token] = (now + NAMES_TTL_S, names)
        return names

    async def sites(self, token: str, page_token: str) -> tuple[list[SiteView], str]:
        request = enrollment_pb2.ListSitesRequest(page_size=PAGE_SIZE, page_token=page_token)
        reply = await self._enrollment(self._enroll.ListSites, request, token)
        return [site_view(s) for s in reply.sites], reply.next_page_token

    async def site(self, token: str, site_id: str) -> tuple[SiteView, list[TokenView]]:
        got = await self._enrollment(
            self._enroll.GetSite, enrollment_pb2.GetSiteRequest(site_id=site_id), token
        )
        listed = await self._enrollment(
            self._enroll.ListEnrollmentTokens,
            enrollment_pb2.ListEnrollmentTokensRequest(site_id=site_id),
            token,
        )
        return site_view(got.site), [token_view(t) for t in listed.tokens]

    async def set_policy(self, token: str, site_id: str, policy: str, pinned: str, channel: str) -> None:
        request = enrollment_pb2.UpdateSiteRequest(
            site_id=site_id, update_policy=POLICIES[policy], update_channel=CHANNELS[channel]
        )
        if policy == "pinned":
            request.pinned_version = pinned
        await self._enrollment(self._enroll.UpdateSite, request, token)

    async def issue_token(
        self, token: str, site_id: str, max_uses: int, ttl_seconds: int, approval: str
    ) -> IssuedToken:
        request = enrollment_pb2.IssueEnrollmentTokenRequest(
            site_id=site_id, max_uses=max_uses, ttl_seconds=ttl_seconds, approval_mode=APPROVALS[approval]
        )
        reply = await self._enrollment(self._enroll.IssueEnrollmentToken, request, token)
        return IssuedToken(token_view(reply.token), reply.plaintext, reply.enroll_command)

    async def revoke_token(self, token: str, token_id: str, with_collectors: bool) -> list[str]:
        request = enrollment_pb2.RevokeEnrollmentTokenRequest(
            token_id=token_id, with_collectors=with_collectors
        )
        reply = await self._enrollment(self._enroll.RevokeEnrollmentToken, request, token)
        return list(reply.revoked_collector_ids)

    # --- the dispatch queue ---------------------------------------------------------------------
    async def dispatches(
        self, token: str, outcome: str, site_id: str, collector_id: str, page_token: str,
        page_size: int = PAGE_SIZE,
    ) -> DispatchPage:  # fmt: skip
        states, task_states = OUTCOMES[outcome]
        request = task_router_pb2.ListDispatchesRequest(
            states=states, task_states=task_states, site_id=site_id, collector_id=collector_id,
            page_size=page_size, page_token=page_token,
        )  # fmt: skip
        reply = await self._call(self._tasks.ListDispatches, request, token)
        return DispatchPage([dispatch_view(d) for d in reply.dispatches], reply.next_page_token)

    async def dispatch(self, token: str, dispatch_id: str) -> tuple[DispatchView, TaskView]:
        reply = await self._call(
            self._tasks.GetDispatch, task_router_pb2.GetDispatchRequest(dispatch_id=dispatch_id), token
        )
        return dispatch_view(reply.dispatch), task_view(reply.task)

    async def resolve(self, token: str, task_id: str, resolution: str, note: str) -> TaskView:
        request = task_router_pb2.ResolveIndeterminateRequest(
            task_id=task_id, resolution=RESOLUTIONS[resolution], note=note
        )
        reply = await self._call(self._tasks.ResolveIndeterminate, request, token)
        return task_view(reply.task)


def _number(names: Mapping[Any, str], name: str) -> Any:
    """The enum number a view name stands for (0, unspecified, for none)."""
    return next((number for number, named in names.items() if named == name), 0)
