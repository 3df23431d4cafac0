"""Collector-facing enrollment endpoints on the gateway.

GET  /api/collector/v1/trust       public: the gateway's internal CA, to check against the pin
POST /api/collector/v1/enroll      public: redeem a token + CSR for the trust bootstrap
GET  /api/collector/v1/enrollment  bearer: enrollment status (pending collectors poll this)
POST /api/collector/v1/renew       bearer: a fresh certificate for the same or a new key
"""

from __future__ import annotations

import datetime as dt
from typing import TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, ValidationError
from versus.enrollment.v1 import enrollment_pb2 as pb

from common.errors import InvalidArgument, NotFound
from common.redis import revocations
from common.telemetry import tracing
from gateway.auth import ANY_ENROLLED, authenticate, check_body
from gateway.body import read_json_body
from gateway.body_fields import Name
from gateway.clients import call

# Body limits (docs/gateway.md): a CSR is ~500 bytes; these leave generous room and no more.
MAX_ENROLL_BODY = 64 * 1024
MAX_RENEW_BODY = 32 * 1024

router = APIRouter(prefix="/api/collector/v1", tags=["enrollment"])


class CollectorFacts(BaseModel):
    hostname: Name = Field(default="", max_length=255)
    os: Name = Field(default="", max_length=64)
    arch: Name = Field(default="", max_length=64)
    version: Name = Field(default="", max_length=64)
    fips_requested: bool = False


class EnrollBody(BaseModel):
    token: str = Field(max_length=256)
    csr_pem: str = Field(max_length=16 * 1024)
    collector: CollectorFacts = Field(default_factory=CollectorFacts)


class GatewayOut(BaseModel):
    addrs: list[str]
    server_name: str


class AuthOut(BaseModel):
    mode: str
    audience: str


class KeyOut(BaseModel):
    kid: str
    alg: str
    pub: str
    not_after: str


class PolicyOut(BaseModel):
    vault_mode: str
    heartbeat_interval_s: int
    max_concurrency: dict[str, int]


class EnrollOut(BaseModel):
    collector_id: str
    status: str
    cert_chain_pem: str
    ca_bundle_pem: str
    gateway: GatewayOut
    auth: AuthOut
    dispatch_keys: list[KeyOut]
    release_keys: list[KeyOut]
    key_versions: dict[str, int] = Field(
        description="versions of the dispatch and release key sets and of the trust bundle handed out; "
        "later versions arrive in claim answers, signed (docs/day2.md)"
    )
    site_id: str
    policy: PolicyOut


class TrustOut(BaseModel):
    gateway_ca_pem: str = Field(
        description="every gateway CA collectors may meet, PEM (two while a rotation is under way)"
    )
    pin: str = Field(description="SPKI pin of the CA that issued the gateway's certificate now")
    cross_pem: str = Field(
        default="",
        description="each newer gateway CA certified by the one before it, PEM: a collector that pins "
        "an older CA trusts its successors through these (docs/day2.md)",
    )


class StatusOut(BaseModel):
    collector_id: str
    status: str
    cert_not_after: str


class RenewBody(BaseModel):
    csr_pem: str = Field(max_length=16 * 1024)


class RenewOut(BaseModel):
    collector_id: str
    cert_chain_pem: str
    ca_bundle_pem: str
    cert_not_after: str


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: bytes) -> M:
    """Validate a JSON body against its model; any problem is 400 ``invalid_body`` naming the field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidArgument(
            f"{where}: {first['msg']}" if where else first["msg"], code="invalid_body"
        ) from None


def _rfc3339(ts: object) -> str:
    value: dt.datetime = ts.ToDatetime(tzinfo=dt.UTC)  # type: ignore[attr-defined]
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _keys(keys: object) -> list[KeyOut]:
    return [KeyOut(kid=k.kid, alg=k.alg, pub=k.pub, not_after=_rfc3339(k.not_after)) for k in keys]  # type: ignore[attr-defined]


@router.get("/trust", response_model=TrustOut)
async def trust(request: Request) -> TrustOut:
    """The gateway's internal CAs; a collector checks them against the pin from its enroll command."""
    source = request.app.state.trust_bundle
    bundle = source() if source is not None else None
    if bundle is None or not bundle.gateway or bundle.gateway_pin is None:
        raise NotFound("this gateway uses a publicly trusted certificate", code="no_internal_ca")
    return TrustOut(
        gateway_ca_pem="".join(bundle.gateway), pin=bundle.gateway_pin, cross_pem="".join(bundle.cross)
    )


@router.post("/enroll", response_model=EnrollOut)
async def enroll(request: Request) -> EnrollOut:
    """Redeem an enrollment token and a CSR for a certificate and the trust bootstrap."""
    body = parse_body(EnrollBody, await read_json_body(request, MAX_ENROLL_BODY))
    c = body.collector
    with tracing.span("versus.gateway.enroll", root=True, kind="server"):
        reply = await call(
            request.app.state.backends.enrollment.Enroll,
            pb.EnrollRequest(
                token=body.token,
                csr_pem=body.csr_pem,
                collector=pb.CollectorInfo(
                    hostname=c.hostname,
                    os=c.os,
                    arch=c.arch,
                    version=c.version,
                    fips_requested=c.fips_requested,
                ),
            ),
            request.state.request_id,
        )
    return EnrollOut(
        collector_id=reply.collector_id,
        status=reply.status,
        cert_chain_pem=reply.cert_chain_pem,
        ca_bundle_pem=reply.ca_bundle_pem,
        gateway=GatewayOut(addrs=list(reply.gateway.addrs), server_name=reply.gateway.server_name),
        auth=AuthOut(mode=reply.auth.mode, audience=reply.auth.audience),
        dispatch_keys=_keys(reply.dispatch_keys),
        release_keys=_keys(reply.release_keys),
        key_versions={
            "dispatch": max(reply.dispatch_key_version, 1),
            "release": max(reply.release_key_version, 1),
            "trust": max(reply.trust_version, 1),
        },
        site_id=reply.site_id,
        policy=PolicyOut(
            vault_mode=reply.policy.vault_mode,
            heartbeat_interval_s=reply.policy.heartbeat_interval_s,
            max_concurrency=dict(reply.policy.max_concurrency),
        ),
    )


@router.get("/enrollment", response_model=StatusOut)
async def enrollment_status(request: Request) -> StatusOut:
    """Enrollment status of the calling collector; pending collectors poll this until approved."""
    claims, _ = await authenticate(request, request.app.state.store, ANY_ENROLLED)
    reply = await call(
        request.app.state.backends.enrollment.GetEnrollmentStatus,
        pb.GetEnrollmentStatusRequest(collector_id=claims.collector_id),
        request.state.request_id,
    )
    return StatusOut(
        collector_id=reply.collector_id, status=reply.status, cert_not_after=_rfc3339(reply.cert_not_after)
    )


@router.post("/renew", response_model=RenewOut)
async def renew(request: Request) -> RenewOut:
    """A new 90-day certificate for the calling collector (same or new P-256 key, same id)."""
    claims, _ = await authenticate(request, request.app.state.store, body_follows=True)
    raw = await read_json_body(request, MAX_RENEW_BODY)
    check_body(claims, raw)
    body = parse_body(RenewBody, raw)
    attributes = {"versus.collector_id": claims.collector_id}
    with tracing.span("versus.gateway.renew", root=True, kind="server", attributes=attributes):
        reply = await call(
            request.app.state.backends.enrollment.RenewCertificate,
            pb.RenewCertificateRequest(collector_id=claims.collector_id, csr_pem=body.csr_pem),
            request.state.request_id,
        )
    # The key may be new: no gateway may go on accepting the old one from a record it keeps.
    request.app.state.store.forget(claims.collector_id)
    await revocations.standing_changed(request.app.state.connections.redis, claims.collector_id)
    return RenewOut(
        collector_id=reply.collector_id,
        cert_chain_pem=reply.cert_chain_pem,
        ca_bundle_pem=reply.ca_bundle_pem,
        cert_not_after=_rfc3339(reply.cert_not_after),
    )
