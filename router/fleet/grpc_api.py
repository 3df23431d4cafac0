"""gRPC adapter: FleetService messages to and from :mod:`router.fleet.operations` calls (conversion only)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator, Mapping
from typing import TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from sqlalchemy.engine import RowMapping
from versus.fleet.v1 import fleet_pb2 as pb
from versus.fleet.v1 import fleet_pb2_grpc

from common.access.rbac import current_actor
from common.errors import InvalidArgument, Unavailable
from common.grpc.pb_time import timestamp as _ts
from common.grpc.server import Context
from common.trust import pki
from router.core.fleet_state import CollectorStatus, SessionState
from router.fleet import gauges, health
from router.fleet.enrollment_client import forwarded
from router.fleet.operations import CollectorView, Fleet, ListFilters, UpdateView
from router.releases.publishing import DOWNLOAD_CHUNK, Header, Releases
from router.releases.update_policy import Badge
from router.releases.updates import Updates

E = TypeVar("E")

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100

STATUS_TO_PB = {
    CollectorStatus.PENDING: pb.COLLECTOR_STATUS_PENDING,
    CollectorStatus.ACTIVE: pb.COLLECTOR_STATUS_ACTIVE,
    CollectorStatus.REVOKED: pb.COLLECTOR_STATUS_REVOKED,
    CollectorStatus.EXPIRED: pb.COLLECTOR_STATUS_EXPIRED,
    CollectorStatus.DENIED: pb.COLLECTOR_STATUS_DENIED,
}
SESSION_TO_PB = {
    SessionState.ACTIVE: pb.SESSION_STATE_ACTIVE,
    SessionState.STALE: pb.SESSION_STATE_STALE,
    SessionState.DRAINING: pb.SESSION_STATE_DRAINING,
    SessionState.DEAD: pb.SESSION_STATE_DEAD,
    SessionState.OFFLINE: pb.SESSION_STATE_OFFLINE,
}
VAULT_TO_PB = {
    "local": pb.VAULT_MODE_LOCAL,
    "relayed": pb.VAULT_MODE_CLOUD_RELAYED,
    "external": pb.VAULT_MODE_EXTERNAL,
}
VAULT_FROM_PB = {v: k for k, v in VAULT_TO_PB.items()}
DELIVERY_TO_PB = {"wrapped": pb.SECRET_ID_DELIVERY_WRAPPED, "plain": pb.SECRET_ID_DELIVERY_PLAIN}
DELIVERY_FROM_PB = {v: k for k, v in DELIVERY_TO_PB.items()}
CHANNEL_TO_PB = {"stable": pb.CHANNEL_STABLE, "beta": pb.CHANNEL_BETA}
CHANNEL_FROM_PB = {v: k for k, v in CHANNEL_TO_PB.items()}
BADGE_TO_PB = {
    Badge.UNKNOWN: pb.UPDATE_BADGE_UNSPECIFIED,
    Badge.UP_TO_DATE: pb.UPDATE_BADGE_UP_TO_DATE,
    Badge.UPDATE_AVAILABLE: pb.UPDATE_BADGE_UPDATE_AVAILABLE,
    Badge.UPDATING: pb.UPDATE_BADGE_UPDATING,
    Badge.FAILED: pb.UPDATE_BADGE_FAILED,
    Badge.ROLLED_BACK: pb.UPDATE_BADGE_ROLLED_BACK,
}
# The artifact arrives in messages of at most this many bytes (under gRPC's 4 MiB default).
MAX_CHUNK_BYTES = 1 << 20


def update_pb(u: UpdateView) -> pb.CollectorUpdate:
    out = pb.CollectorUpdate(
        running_version=u.running_version, latest_version=u.latest_version, policy=u.policy,
        channel=u.channel, target_version=u.target_version, approved_version=u.approved_version,
        badge=BADGE_TO_PB[u.badge], state=u.state, state_version=u.state_version, detail=u.detail,
    )  # fmt: skip
    if u.state_at is not None:
        out.state_at.FromDatetime(u.state_at)
    return out


def release_pb(row: RowMapping, sbom: bytes = b"") -> pb.Release:
    out = pb.Release(
        version=row["version"], channel=CHANNEL_TO_PB[row["channel"]], security_fix=row["security_fix"],
        os=row["os"], arch=row["arch"], sha256=row["sha256"], notes=row["notes"],
        published_at=_ts(row["published_at"]), target_name=row["target_name"], length=row["length"],
        published_by=row["published_by"], yanked=row["yanked_at"] is not None,
        yanked_by=row["yanked_by"] or "", yank_reason=row["yank_reason"] or "",
        running_count=int(row["running_count"]), sbom_target_name=row["sbom_target_name"] or "",
        sbom_sha256=row["sbom_sha256"] or "", sbom_length=row["sbom_length"] or 0,
        sbom_spec_version=row["sbom_spec_version"] or "", sbom_components=row["sbom_components"] or 0,
        sbom=sbom,
    )  # fmt: skip
    if row["yanked_at"] is not None:
        out.yanked_at.FromDatetime(row["yanked_at"])
    return out


def collector_pb(view: CollectorView) -> pb.Collector:
    r, s = view.row, view.session
    session = pb.Session(
        state=SESSION_TO_PB[s.state],
        session_id=s.session_id,
        established_at=_ts(s.established_at),
        last_heartbeat_at=_ts(s.last_heartbeat),
        transport=s.transport,
        vault_mode=VAULT_TO_PB.get(s.vault_mode, pb.VAULT_MODE_UNSPECIFIED),
        agent_version=s.agent_version,
        self_draining=s.self_draining,
        key_versions=s.key_versions,
        protocol_version=s.protocol_version,
        goodbye_reason=s.goodbye_reason,
    )
    if s.heartbeat_age_s is not None:
        session.heartbeat_age_s = int(s.heartbeat_age_s)
    drivers = []
    manifest = (r["manifest"] or {}).get("providers", {})
    for provider, spec in sorted(manifest.items()):
        ops = [
            pb.OperationCapability(
                name=op["name"],
                op_class=op["op_class"],
                timeout_s=int(op.get("timeout_s", 0)),
                parallel_safe=bool(op.get("parallel_safe")),
            )
            for op in spec.get("operations", [])
        ]
        drivers.append(
            pb.DriverCapabilities(
                provider=provider, max_concurrency=int(spec.get("max_concurrency", 0)), operations=ops
            )
        )
    fingerprint, issuer = _cert_facts(r["cert_pem"])
    return pb.Collector(
        collector_id=r["collector_id"],
        site_id=r["site_id"],
        hostname=r["hostname"],
        os=r["os"],
        arch=r["arch"],
        agent_version=s.agent_version or r["agent_version"],
        fips=bool(r["fips_reported"]) if r["fips_reported"] is not None else bool(r["fips_requested"]),
        status=STATUS_TO_PB[view.status],
        session_state=SESSION_TO_PB[s.state],
        cert_serial=r["cert_serial"],
        cert_fingerprint_sha256=fingerprint,
        cert_issuer=issuer,
        cert_not_after=_ts(r["cert_not_after"]),
        enrolled_at=_ts(r["enrolled_at"]),
        last_seen_at=_ts(s.last_heartbeat),
        vault_mode=VAULT_TO_PB[r["vault_mode"]],
        vault_integration_id=r["vault_integration_id"] or "",
        queue_depth=view.queue_depth,
        drained=view.drained,
        session=session,
        drivers=drivers,
        status_changed_at=_ts(r["status_changed_at"]),
        update=update_pb(view.update) if view.update is not None else None,
        vault_secret_version=int(r["vault_secret_version"]),
    )


def _cert_facts(cert_pem: str) -> tuple[str, str]:
    """The certificate's SHA-256 fingerprint (hex with colons, as `openssl x509 -fingerprint -sha256`)
    and the id of the CA that issued it (common/trust/pki.py ``issuer_id``); empty when unreadable."""
    if not cert_pem:
        return "", ""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
    except ValueError:
        return "", ""
    return ":".join(f"{b:02X}" for b in cert.fingerprint(hashes.SHA256())), pki.issuer_id(cert)


def integration_pb(row: RowMapping) -> pb.VaultIntegration:
    return pb.VaultIntegration(
        integration_id=row["integration_id"],
        name=row["name"],
        address=row["address"],
        role_id=row["role_id"],
        kv_mount=row["kv_mount"],
        created_at=_ts(row["created_at"]),
        path_prefix=row["path_prefix"],
        ca_pem=row["ca_pem"] or "",
        secret_id_delivery=DELIVERY_TO_PB[row["secret_id_delivery"]],
    )


def _from_pb(table: Mapping[E, int], value: int, field: str) -> E | None:
    """The domain value of a filter enum (``None`` when unspecified)."""
    if value == 0:
        return None
    for domain, number in table.items():
        if number == value:
            return domain
    raise InvalidArgument(f"{field} {value} is not one this server knows", code=f"{field}_invalid")


class FleetServicer(fleet_pb2_grpc.FleetServiceServicer):
    """Collector list, detail and admin actions; releases and upgrades."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    async def GetFleetHealth(
        self, request: pb.GetFleetHealthRequest, context: Context
    ) -> pb.GetFleetHealthResponse:
        sample = gauges.GAUGES.sample
        if not sample.sampled_at:
            raise Unavailable(
                "the fleet has not been sampled yet: ask again in a moment", code="fleet_not_sampled"
            )
        return health.health_pb(sample, time.time())

    async def ListCollectors(
        self, request: pb.ListCollectorsRequest, context: Context
    ) -> pb.ListCollectorsResponse:
        size = request.page_size or DEFAULT_PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be at most {MAX_PAGE_SIZE}", code="page_size_too_large")
        within = request.expiring_within.ToTimedelta() if request.HasField("expiring_within") else None
        if within is not None and within < dt.timedelta(0):
            raise InvalidArgument("expiring_within must not be negative", code="expiring_within_invalid")
        filters = ListFilters(
            outdated=request.outdated,
            status=_from_pb(STATUS_TO_PB, request.status, "status"),
            session=_from_pb(SESSION_TO_PB, request.session_state, "session_state"),
            version=request.agent_version.strip(),
        )
        views = await self.fleet.list(
            query=request.query.strip(), site_id=request.site_id, after=request.page_token, limit=size + 1,
            expiring_within=within, driver=request.driver.strip(), filters=filters,
        )  # fmt: skip
        page = views[:size]
        token = page[-1].collector_id if len(views) > size else ""
        behind = await self.fleet.outdated_count(
            query=request.query.strip(), site_id=request.site_id, expiring_within=within
        )
        return pb.ListCollectorsResponse(
            collectors=[collector_pb(v) for v in page], next_page_token=token, outdated_count=behind
        )

    async def GetCollector(
        self, request: pb.GetCollectorRequest, context: Context
    ) -> pb.GetCollectorResponse:
        return pb.GetCollectorResponse(collector=collector_pb(await self.fleet.get(request.collector_id)))

    async def ProbeCollector(
        self, request: pb.ProbeCollectorRequest, context: Context
    ) -> pb.ProbeCollectorResponse:
        probe, depth = await self.fleet.probe(request.collector_id)
        reply = pb.ProbeCollectorResponse(
            reachable=probe.reachable, session_state=SESSION_TO_PB[probe.session], queue_depth=depth
        )
        if probe.heartbeat_age_s is not None:
            reply.heartbeat_age_s = int(probe.heartbeat_age_s)
        return reply

    async def ApproveCollector(
        self, request: pb.ApproveCollectorRequest, context: Context
    ) -> pb.ApproveCollectorResponse:
        return pb.ApproveCollectorResponse(
            collector=collector_pb(await self.fleet.approve(request.collector_id, _caller(context)))
        )

    async def DenyCollector(
        self, request: pb.DenyCollectorRequest, context: Context
    ) -> pb.DenyCollectorResponse:
        view = await self.fleet.deny(request.collector_id, request.reason, _caller(context))
        return pb.DenyCollectorResponse(collector=collector_pb(view))

    async def DrainCollector(
        self, request: pb.DrainCollectorRequest, context: Context
    ) -> pb.DrainCollectorResponse:
        return pb.DrainCollectorResponse(collector=collector_pb(await self.fleet.drain(request.collector_id)))

    async def UndrainCollector(
        self, request: pb.UndrainCollectorRequest, context: Context
    ) -> pb.UndrainCollectorResponse:
        return pb.UndrainCollectorResponse(
            collector=collector_pb(await self.fleet.undrain(request.collector_id))
        )

    async def RevokeCollector(
        self, request: pb.RevokeCollectorRequest, context: Context
    ) -> pb.RevokeCollectorResponse:
        view = await self.fleet.revoke(request.collector_id, request.reason, _caller(context))
        return pb.RevokeCollectorResponse(collector=collector_pb(view))

    async def SetVaultMode(
        self, request: pb.SetVaultModeRequest, context: Context
    ) -> pb.SetVaultModeResponse:
        mode = VAULT_FROM_PB.get(request.vault_mode)
        if mode is None:
            raise InvalidArgument("vault_mode is required", code="vault_mode_invalid")
        view = await self.fleet.set_vault_mode(
            request.collector_id, mode, request.integration_id, request.secret_id
        )
        return pb.SetVaultModeResponse(collector=collector_pb(view))

    async def CreateVaultIntegration(
        self, request: pb.CreateVaultIntegrationRequest, context: Context
    ) -> pb.CreateVaultIntegrationResponse:
        row = await self.fleet.create_integration(
            {
                "name": request.name,
                "address": request.address,
                "role_id": request.role_id,
                "kv_mount": request.kv_mount,
                "path_prefix": request.path_prefix or "versus",
                "ca_pem": request.ca_pem,
                "secret_id_delivery": DELIVERY_FROM_PB.get(request.secret_id_delivery, "wrapped"),
            }
        )
        return pb.CreateVaultIntegrationResponse(integration=integration_pb(row))

    async def ListVaultIntegrations(
        self, request: pb.ListVaultIntegrationsRequest, context: Context
    ) -> pb.ListVaultIntegrationsResponse:
        rows = await self.fleet.integrations()
        return pb.ListVaultIntegrationsResponse(integrations=[integration_pb(r) for r in rows])

    # --- releases and upgrades (router/releases/publishing.py, router/releases/updates.py) ---------
    @property
    def releases(self) -> Releases:
        releases: Releases | None = self.fleet.router.releases
        if releases is None:
            raise Unavailable("this router serves no update repository", code="releases_unavailable")
        return releases

    @property
    def updates(self) -> Updates:
        updates: Updates | None = self.fleet.router.updates
        if updates is None:
            raise Unavailable("this router does not manage upgrades", code="releases_unavailable")
        return updates

    async def PublishRelease(
        self, request_iterator: AsyncIterator[pb.PublishReleaseRequest], context: Context
    ) -> pb.PublishReleaseResponse:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidArgument(
                "the first message must be the release header", code="release_header_missing"
            )
        h = first.header
        header = Header(
            version=h.version.strip(), channel=CHANNEL_FROM_PB.get(h.channel, ""),
            security_fix=h.security_fix, os=h.os, arch=h.arch, notes=h.notes, length=h.length,
            sha256=h.sha256.lower(), sbom=h.sbom,
        )  # fmt: skip

        async def chunks() -> AsyncIterator[bytes]:
            async for message in request_iterator:
                if message.WhichOneof("part") != "chunk":
                    raise InvalidArgument(
                        "only the first message is a header", code="release_header_repeated"
                    )
                if len(message.chunk) > MAX_CHUNK_BYTES:
                    raise InvalidArgument(
                        f"chunks are at most {MAX_CHUNK_BYTES} bytes", code="chunk_too_large"
                    )
                yield message.chunk

        [row] = await self.releases.publish(header, chunks(), current_actor())
        return pb.PublishReleaseResponse(release=release_pb(row))

    async def ListReleases(
        self, request: pb.ListReleasesRequest, context: Context
    ) -> pb.ListReleasesResponse:
        releases = self.releases
        rows = await releases.list(CHANNEL_FROM_PB.get(request.channel, ""), request.include_yanked)
        return pb.ListReleasesResponse(
            releases=[release_pb(r) for r in rows], manifest_url=releases.manifest_url,
            update_pubkey=releases.keys().current.kid,
        )  # fmt: skip

    async def DownloadRelease(
        self, request: pb.DownloadReleaseRequest, context: Context
    ) -> AsyncIterator[pb.DownloadReleaseResponse]:
        row, path = await self.releases.artifact(request.version.strip(), request.os, request.arch)
        first = True
        with path.open("rb") as artifact:
            while block := await asyncio.to_thread(artifact.read, DOWNLOAD_CHUNK):
                reply = pb.DownloadReleaseResponse(data=block)
                if first:
                    reply.target_name, reply.length, reply.sha256 = (
                        row["target_name"],
                        row["length"],
                        row["sha256"],
                    )
                    first = False
                yield reply

    async def GetRelease(self, request: pb.GetReleaseRequest, context: Context) -> pb.GetReleaseResponse:
        rows = await self.releases.get(request.version.strip())
        sboms = await self.releases.sboms(request.version.strip()) if request.include_sbom else {}
        return pb.GetReleaseResponse(releases=[release_pb(r, sboms.get(r["target_name"], b"")) for r in rows])

    async def YankRelease(self, request: pb.YankReleaseRequest, context: Context) -> pb.YankReleaseResponse:
        rows = await self.releases.yank(request.version.strip(), request.reason, current_actor())
        return pb.YankReleaseResponse(releases=[release_pb(r) for r in rows])

    async def ApplyUpdate(self, request: pb.ApplyUpdateRequest, context: Context) -> pb.ApplyUpdateResponse:
        await self.updates.apply(request.collector_id, request.target_version.strip(), current_actor())
        return pb.ApplyUpdateResponse(collector=collector_pb(await self.fleet.get(request.collector_id)))

    async def CancelUpdate(
        self, request: pb.CancelUpdateRequest, context: Context
    ) -> pb.CancelUpdateResponse:
        await self.updates.cancel(request.collector_id, current_actor())
        return pb.CancelUpdateResponse(collector=collector_pb(await self.fleet.get(request.collector_id)))


def _caller(context: Context) -> list[tuple[str, str]]:
    """The caller's credentials, for the enrollment service to authorise and audit."""
    return forwarded(context.invocation_metadata())
