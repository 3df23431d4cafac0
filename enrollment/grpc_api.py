"""gRPC adapter: EnrollmentService messages to and from :mod:`enrollment.service` calls.

Only conversion lives here; errors raised by the service are mapped to gRPC
statuses by the shared interceptor.
"""

from __future__ import annotations

import datetime as dt

from google.protobuf.timestamp_pb2 import Timestamp
from versus.enrollment.v1 import enrollment_pb2 as pb
from versus.enrollment.v1 import enrollment_pb2_grpc

from common.access import rbac
from common.errors import InvalidArgument, VersusError
from common.grpc.server import Context
from enrollment import tokens
from enrollment.metrics import ENROLLMENTS, REFUSALS, RENEWALS
from enrollment.service import CollectorInfo, EnrollmentService, TrustBootstrap
from enrollment.store import Site, Token

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100

_POLICY_TO_PB = {
    "manual": pb.UPDATE_POLICY_MANUAL,
    "auto": pb.UPDATE_POLICY_AUTO,
    "pinned": pb.UPDATE_POLICY_PINNED,
}
_POLICY_FROM_PB = {v: k for k, v in _POLICY_TO_PB.items()}
_CHANNEL_TO_PB = {"stable": pb.UPDATE_CHANNEL_STABLE, "beta": pb.UPDATE_CHANNEL_BETA}
_CHANNEL_FROM_PB = {v: k for k, v in _CHANNEL_TO_PB.items()}
_APPROVAL_FROM_PB = {
    pb.APPROVAL_MODE_UNSPECIFIED: "auto",
    pb.APPROVAL_MODE_AUTO: "auto",
    pb.APPROVAL_MODE_MANUAL: "manual",
}
_APPROVAL_TO_PB = {"auto": pb.APPROVAL_MODE_AUTO, "manual": pb.APPROVAL_MODE_MANUAL}
_STATUS_TO_PB = {
    tokens.TokenStatus.ACTIVE: pb.TOKEN_STATUS_ACTIVE,
    tokens.TokenStatus.EXHAUSTED: pb.TOKEN_STATUS_EXHAUSTED,
    tokens.TokenStatus.EXPIRED: pb.TOKEN_STATUS_EXPIRED,
    tokens.TokenStatus.REVOKED: pb.TOKEN_STATUS_REVOKED,
}


def timestamp(value: dt.datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def site_pb(site: Site) -> pb.Site:
    return pb.Site(
        site_id=site.site_id,
        name=site.name,
        tenant_id=site.tenant_id,
        update_policy=_POLICY_TO_PB[site.update_policy],
        pinned_version=site.pinned_version or "",
        created_at=timestamp(site.created_at),
        collector_count=site.collector_count,
        update_channel=_CHANNEL_TO_PB.get(site.update_channel, pb.UPDATE_CHANNEL_UNSPECIFIED),
    )


def bootstrap_pb(result: TrustBootstrap) -> pb.EnrollResponse:
    return pb.EnrollResponse(
        collector_id=result.collector_id,
        cert_chain_pem=result.cert_chain_pem,
        ca_bundle_pem=result.ca_bundle_pem,
        gateway=pb.GatewayInfo(addrs=list(result.gateway_addrs), server_name=result.gateway_server_name),
        auth=pb.AuthInfo(mode=result.auth_mode, audience=result.audience),
        dispatch_keys=[_key_pb(k) for k in result.dispatch_keys],
        release_keys=[_key_pb(k) for k in result.release_keys],
        dispatch_key_version=result.dispatch_key_version,
        release_key_version=result.release_key_version,
        trust_version=result.trust_version,
        site_id=result.site_id,
        policy=pb.CollectorPolicy(
            vault_mode=result.policy.vault_mode,
            heartbeat_interval_s=result.policy.heartbeat_interval_s,
            max_concurrency=dict(result.policy.max_concurrency),
        ),
        status=result.status,
    )


def _key_pb(key: dict[str, str]) -> pb.VerificationKey:
    not_after = dt.datetime.fromisoformat(key["not_after"].replace("Z", "+00:00"))
    return pb.VerificationKey(kid=key["kid"], alg=key["alg"], pub=key["pub"], not_after=timestamp(not_after))


class EnrollmentServicer(enrollment_pb2_grpc.EnrollmentServiceServicer):
    def __init__(self, service: EnrollmentService):
        self.service = service

    def _token_pb(self, token: Token) -> pb.EnrollmentToken:
        return pb.EnrollmentToken(
            token_id=token.token_id,
            site_id=token.site_id,
            max_uses=token.max_uses,
            uses=token.uses,
            expires_at=timestamp(token.expires_at),
            approval_mode=_APPROVAL_TO_PB[token.approval_mode],
            status=_STATUS_TO_PB[self.service.token_status(token)],
            created_at=timestamp(token.created_at),
            display_prefix=token.display_prefix,
        )

    async def Enroll(self, request: pb.EnrollRequest, context: Context) -> pb.EnrollResponse:
        c = request.collector
        info = CollectorInfo(c.hostname, c.os, c.arch, c.version, c.fips_requested)
        try:
            bootstrap = await self.service.enroll(request.token, request.csr_pem, info)
        except VersusError as exc:
            REFUSALS.labels("enroll", exc.code).inc()
            raise
        ENROLLMENTS.labels(bootstrap.status).inc()
        return bootstrap_pb(bootstrap)

    async def CreateSite(self, request: pb.CreateSiteRequest, context: Context) -> pb.CreateSiteResponse:
        policy = _POLICY_FROM_PB.get(request.update_policy, "manual")
        site = await self.service.create_site(
            request.name, request.tenant_id, policy, request.pinned_version or None,
            _CHANNEL_FROM_PB.get(request.update_channel, "stable"),
        )  # fmt: skip
        return pb.CreateSiteResponse(site=site_pb(site))

    async def GetSite(self, request: pb.GetSiteRequest, context: Context) -> pb.GetSiteResponse:
        return pb.GetSiteResponse(site=site_pb(await self.service.store.get_site(request.site_id)))

    async def ListSites(self, request: pb.ListSitesRequest, context: Context) -> pb.ListSitesResponse:
        size = request.page_size or DEFAULT_PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be at most {MAX_PAGE_SIZE}", code="page_size_too_large")
        sites = await self.service.store.list_sites(request.tenant_id, size + 1, request.page_token)
        more = len(sites) > size
        sites = sites[:size]
        return pb.ListSitesResponse(
            sites=[site_pb(s) for s in sites], next_page_token=sites[-1].site_id if more and sites else ""
        )

    async def UpdateSite(self, request: pb.UpdateSiteRequest, context: Context) -> pb.UpdateSiteResponse:
        site = await self.service.update_site(
            request.site_id,
            name=request.name if request.HasField("name") else None,
            update_policy=_POLICY_FROM_PB.get(request.update_policy)
            if request.HasField("update_policy")
            else None,
            pinned_version=request.pinned_version if request.HasField("pinned_version") else None,
            update_channel=_CHANNEL_FROM_PB.get(request.update_channel, "")
            if request.HasField("update_channel")
            else None,
        )
        return pb.UpdateSiteResponse(site=site_pb(site))

    async def DeleteSite(self, request: pb.DeleteSiteRequest, context: Context) -> pb.DeleteSiteResponse:
        await self.service.store.delete_site(request.site_id)
        return pb.DeleteSiteResponse()

    async def IssueEnrollmentToken(
        self, request: pb.IssueEnrollmentTokenRequest, context: Context
    ) -> pb.IssueEnrollmentTokenResponse:
        issued = await self.service.issue_token(
            request.site_id,
            max_uses=request.max_uses if request.HasField("max_uses") else None,
            ttl_seconds=request.ttl_seconds if request.HasField("ttl_seconds") else None,
            approval_mode=_APPROVAL_FROM_PB.get(request.approval_mode, "auto"),
            actor=rbac.current_actor(),
        )
        return pb.IssueEnrollmentTokenResponse(
            token=self._token_pb(issued.token),
            plaintext=issued.plaintext,
            enroll_command=issued.enroll_command,
        )

    async def ListEnrollmentTokens(
        self, request: pb.ListEnrollmentTokensRequest, context: Context
    ) -> pb.ListEnrollmentTokensResponse:
        found = await self.service.store.list_tokens(request.site_id)
        return pb.ListEnrollmentTokensResponse(tokens=[self._token_pb(t) for t in found])

    async def RevokeEnrollmentToken(
        self, request: pb.RevokeEnrollmentTokenRequest, context: Context
    ) -> pb.RevokeEnrollmentTokenResponse:
        token, revoked = await self.service.store.revoke_token(
            request.token_id, rbac.current_actor(), with_collectors=request.with_collectors
        )
        return pb.RevokeEnrollmentTokenResponse(token=self._token_pb(token), revoked_collector_ids=revoked)

    async def ApproveCollector(
        self, request: pb.ApproveCollectorRequest, context: Context
    ) -> pb.ApproveCollectorResponse:
        status = await self.service.approve(request.collector_id, rbac.current_actor())
        return pb.ApproveCollectorResponse(collector_id=request.collector_id, status=status)

    async def DenyCollector(
        self, request: pb.DenyCollectorRequest, context: Context
    ) -> pb.DenyCollectorResponse:
        status = await self.service.deny(request.collector_id, rbac.current_actor(), request.reason)
        return pb.DenyCollectorResponse(collector_id=request.collector_id, status=status)

    async def RevokeCollector(
        self, request: pb.RevokeCollectorRequest, context: Context
    ) -> pb.RevokeCollectorResponse:
        status = await self.service.revoke(request.collector_id, rbac.current_actor(), request.reason)
        return pb.RevokeCollectorResponse(collector_id=request.collector_id, status=status)

    async def GetEnrollmentStatus(
        self, request: pb.GetEnrollmentStatusRequest, context: Context
    ) -> pb.GetEnrollmentStatusResponse:
        collector = await self.service.status(request.collector_id)
        return pb.GetEnrollmentStatusResponse(
            collector_id=collector.collector_id,
            status=collector.status,
            cert_not_after=timestamp(collector.cert_not_after),
        )

    async def RenewCertificate(
        self, request: pb.RenewCertificateRequest, context: Context
    ) -> pb.RenewCertificateResponse:
        try:
            chain, not_after = await self.service.renew(request.collector_id, request.csr_pem)
        except VersusError as exc:
            REFUSALS.labels("renew", exc.code).inc()
            raise
        RENEWALS.inc()
        return pb.RenewCertificateResponse(
            collector_id=request.collector_id,
            cert_chain_pem=chain,
            ca_bundle_pem=self.service.ca_bundle_pem,
            cert_not_after=timestamp(not_after),
        )
