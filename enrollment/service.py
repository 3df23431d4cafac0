"""Enrollment logic: sites, tokens, redemption, approval and renewal.

Transport-free: the gRPC adapter converts messages to and from these calls.
Redemption checks, in order: the token exists, is unrevoked, unexpired and under
its use limit; the CSR parses, its signature proves possession of the key, the
key is EC P-256 and the CN is a valid collector id that no other collector has.
Every token failure is the same ``invalid_token`` error so a caller learns
nothing about which check failed, and nothing is consumed by a refused attempt.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization

from common.errors import Conflict, FailedPrecondition, InvalidArgument, Unauthenticated, VersusError
from common.telemetry.logs import get_logger
from common.trust.keys import KeySet, PublicKey
from enrollment import tokens
from enrollment.authority import Authority
from enrollment.ca import LEAF_LIFETIME, CsrInfo, validate_csr
from enrollment.store import Collector, EnrollmentStore, Site, Token

log = get_logger("versus.enrollment")

AUTH_MODE = "bearer"
AUDIENCE = "versus-collector-gateway"
UPDATE_POLICIES = ("manual", "auto", "pinned")
UPDATE_CHANNELS = ("stable", "beta")
MAX_NAME_CHARS = 200
MAX_REASON_LENGTH = 500


class InvalidToken(Unauthenticated):
    """Any problem with an enrollment token; deliberately says nothing more."""

    default_code = "invalid_token"

    def __init__(self, known: Token | None = None, why: str = "") -> None:
        super().__init__("the enrollment token is not valid")
        # For the audit log only, never the caller: a token that exists, and why it was refused.
        self.known = known
        self.why = why


@dataclass(frozen=True, slots=True)
class CollectorPolicy:
    vault_mode: str = "local"  # new collectors start in mode A (docs/fleet.md)
    # The claim long-poll hold: a collector claims (its heartbeat) at least this often.
    heartbeat_interval_s: int = 25
    max_concurrency: Mapping[str, int] = field(default_factory=lambda: {"*": 8})


@dataclass(frozen=True, slots=True)
class EnrollmentConfig:
    """Instance facts handed to every collector in the trust bootstrap."""

    trust_domain: str
    public_url: str
    gateway_addrs: tuple[str, ...]
    gateway_server_name: str
    policy: CollectorPolicy = field(default_factory=CollectorPolicy)
    # How long a collector certificate is valid; collectors renew at about two thirds of it.
    cert_lifetime: dt.timedelta = LEAF_LIFETIME


@dataclass(frozen=True, slots=True)
class CollectorInfo:
    hostname: str = ""
    os: str = ""
    arch: str = ""
    version: str = ""
    fips_requested: bool = False


@dataclass(frozen=True, slots=True)
class TrustBootstrap:
    """Everything a collector must trust, returned by a successful enrollment."""

    collector_id: str
    status: str
    cert_chain_pem: str
    ca_bundle_pem: str
    site_id: str
    gateway_addrs: tuple[str, ...]
    gateway_server_name: str
    dispatch_keys: list[dict[str, Any]]
    release_keys: list[dict[str, Any]]
    policy: CollectorPolicy
    # Versions of the two key sets handed out (common/trust/key_chain.py): later ones arrive in-band.
    dispatch_key_version: int = 1
    release_key_version: int = 1
    # Version of the trust bundle in ca_bundle_pem (common/trust/trust_bundle.py): later ones arrive in-band.
    trust_version: int = 1
    auth_mode: str = AUTH_MODE
    audience: str = AUDIENCE


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: Token
    plaintext: str
    enroll_command: str


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _clean(value: str, name: str, limit: int = MAX_NAME_CHARS) -> str:
    value = value.strip()
    if not value or len(value) > limit or not value.isprintable():
        raise InvalidArgument(f"{name} must be 1-{limit} printable characters", code=f"{name}_invalid")
    return value


def _policy(update_policy: str, pinned_version: str | None) -> tuple[str, str | None]:
    if update_policy not in UPDATE_POLICIES:
        raise InvalidArgument(
            f"update_policy must be one of {', '.join(UPDATE_POLICIES)}", code="update_policy_invalid"
        )
    if update_policy == "pinned":
        if not pinned_version:
            raise InvalidArgument(
                "a pinned update policy needs pinned_version", code="pinned_version_missing"
            )
        return update_policy, _clean(pinned_version, "pinned_version", 64)
    if pinned_version:
        raise InvalidArgument(
            "pinned_version is only valid with the pinned policy", code="pinned_version_unexpected"
        )
    return update_policy, None


def _channel(update_channel: str) -> str:
    if update_channel not in UPDATE_CHANNELS:
        raise InvalidArgument(
            f"update_channel must be one of {', '.join(UPDATE_CHANNELS)}", code="update_channel_invalid"
        )
    return update_channel


class EnrollmentService:
    def __init__(
        self,
        store: EnrollmentStore,
        authority: Authority,
        dispatch_keys: Callable[[], KeySet],
        release_keys: Callable[[], KeySet],
        config: EnrollmentConfig,
        clock: Callable[[], dt.datetime] = _now,
    ):
        self.store = store
        self.authority = authority
        self.dispatch_keys = dispatch_keys
        self.release_keys = release_keys
        self.config = config
        self.clock = clock

    # --- sites -----------------------------------------------------------------------------------
    async def create_site(
        self,
        name: str,
        tenant_id: str,
        update_policy: str,
        pinned_version: str | None,
        update_channel: str = "stable",
    ) -> Site:
        policy, pinned = _policy(update_policy or "manual", pinned_version)
        return await self.store.create_site(
            _clean(name, "name"), _clean(tenant_id, "tenant_id"), policy, pinned, _channel(update_channel)
        )

    async def update_site(
        self,
        site_id: str,
        *,
        name: str | None,
        update_policy: str | None,
        pinned_version: str | None,
        update_channel: str | None = None,
    ) -> Site:
        changes: dict[str, Any] = {}
        if name is not None:
            changes["name"] = _clean(name, "name")
        if update_channel is not None:
            changes["update_channel"] = _channel(update_channel)
        if update_policy is not None or pinned_version is not None:
            current = await self.store.get_site(site_id)
            policy = update_policy if update_policy is not None else current.update_policy
            if pinned_version is None:
                # Leaving a pin unmentioned keeps it while pinned and drops it otherwise.
                pinned_version = current.pinned_version if policy == "pinned" else None
            policy, pinned = _policy(policy, pinned_version)
            changes.update(update_policy=policy, pinned_version=pinned)
        if not changes:
            return await self.store.get_site(site_id)
        return await self.store.update_site(site_id, changes)

    # --- tokens ----------------------------------------------------------------------------------
    async def issue_token(
        self,
        site_id: str,
        *,
        max_uses: int | None,
        ttl_seconds: int | None,
        approval_mode: str,
        actor: str = "operator",
    ) -> IssuedToken:
        uses, ttl = tokens.issue_limits(max_uses, ttl_seconds)
        mode = tokens.ApprovalMode(approval_mode or "auto")
        minted = tokens.mint()
        token = await self.store.insert_token(
            {
                "token_id": minted.token_id,
                "site_id": site_id,
                "token_sha256": minted.sha256,
                "display_prefix": minted.display_prefix,
                "max_uses": uses,
                "approval_mode": mode.value,
                "expires_at": self.clock() + ttl,
            },
            actor,
        )
        plaintext = minted.plaintext.reveal()
        # The token itself is not in the command: on a command line every user of the host (ps) and
        # the shell history would see it. The collector asks for it (or reads a file).
        command = ["versus-collector", "enroll", "--url", self.config.public_url]
        pin = self.authority.bundle().gateway_pin
        if pin:
            command += ["--ca-pin", pin]
        command += ["--token-file", "-"]
        log.info("enrollment token issued", token_id=token.token_id, site_id=site_id, max_uses=uses)
        return IssuedToken(token, plaintext, shlex.join(command))

    def token_status(self, token: Token) -> tokens.TokenStatus:
        t = token
        return tokens.status_of(
            uses=t.uses,
            max_uses=t.max_uses,
            expires_at=t.expires_at,
            revoked_at=t.revoked_at,
            now=self.clock(),
        )

    # --- redemption ------------------------------------------------------------------------------
    async def enroll(self, token_plaintext: str, csr_pem: str, info: CollectorInfo) -> TrustBootstrap:
        """Redeem a token for an identity. A refused redemption of a token that exists is audited
        (seed 003: a leaked token replayed after it was used up shows up for operators)."""
        try:
            return await self._enroll(token_plaintext, csr_pem, info)
        except InvalidToken as exc:
            if exc.known is not None:
                requested = _requested_id(csr_pem)
                await self.store.audit_refused_redemption(exc.known.token_id, exc.why, requested)
                log.warning("enrollment token refused", token_id=exc.known.token_id, reason=exc.why)
            raise

    async def _enroll(self, token_plaintext: str, csr_pem: str, info: CollectorInfo) -> TrustBootstrap:
        # The CSR is checked before the token row is locked to keep the lock short;
        # its verdict is only reported after the token checks, in the documented order.
        csr: CsrInfo | None = None
        csr_error: VersusError | None = None
        try:
            csr = validate_csr(csr_pem)
        except VersusError as exc:
            csr_error = exc
        if not tokens.looks_like_token(token_plaintext):
            raise InvalidToken()
        now = self.clock()
        # Handed out once and recorded as handed out: the router signs only with keys a collector holds.
        dispatch_set = self.dispatch_keys()
        dispatch = dispatch_set.public_keys(int(now.timestamp()))
        async with self.store.redemption(tokens.token_hash(token_plaintext)) as tx:
            token = tx.token
            if token is None:
                raise InvalidToken()
            if token.revoked_at is not None or now >= token.expires_at:
                raise InvalidToken(token, "revoked" if token.revoked_at is not None else "expired")
            exhausted = token.uses >= token.max_uses
            if csr is None:
                # An exhausted token is reported as such even when the CSR is also bad.
                assert csr_error is not None
                raise InvalidToken(token, "exhausted") if exhausted else csr_error
            existing = await tx.collector(csr.collector_id)
            if existing is not None:
                if (
                    existing.enrolled_token_id == token.token_id
                    and existing.public_key_sha256 == csr.public_key_sha256
                ):
                    # The first response was lost: hand back the same identity, consume nothing.
                    log.info(
                        "enrollment retried", collector_id=existing.collector_id, token_id=token.token_id
                    )
                    await tx.record_dispatch_kids(existing.collector_id, [k.kid for k in dispatch])
                    return self._bootstrap(existing, dispatch, dispatch_set.version)
                if exhausted:
                    raise InvalidToken(token, "exhausted")
                raise Conflict(
                    f"collector id {csr.collector_id!r} is already enrolled with another key",
                    code="collector_id_taken",
                )
            if exhausted:
                raise InvalidToken(token, "exhausted")
            tenant_id = await self.store.site_tenant(tx.conn, token.site_id)
            cert = self.authority.issuing().issue(
                csr, site_id=token.site_id, trust_domain=self.config.trust_domain, now=now,
                lifetime=self.config.cert_lifetime,
            )  # fmt: skip
            status = "active" if token.approval_mode == tokens.ApprovalMode.AUTO else "pending"
            values = {
                "collector_id": csr.collector_id,
                "site_id": token.site_id,
                "tenant_id": tenant_id,
                "status": status,
                "public_key_der": csr.public_key_der,
                "public_key_sha256": csr.public_key_sha256,
                "cert_pem": cert.public_bytes(serialization.Encoding.PEM).decode("ascii"),
                "cert_serial": format(cert.serial_number, "x"),
                "cert_not_after": cert.not_valid_after_utc,
                "hostname": info.hostname[:255],
                "os": info.os[:64],
                "arch": info.arch[:64],
                "agent_version": info.version[:64],
                "fips_requested": info.fips_requested,
                "dispatch_kids": [k.kid for k in dispatch],
            }
            await tx.create_collector(values)
            await tx.audit(
                "collector.enroll",
                csr.collector_id,
                {
                    "site_id": token.site_id,
                    "token_id": token.token_id,
                    "status": status,
                    "cert_serial": values["cert_serial"],
                },
            )
            collector = await tx.collector(csr.collector_id)
        assert collector is not None
        log.info(
            "collector enrolled",
            collector_id=collector.collector_id,
            site_id=collector.site_id,
            status=status,
        )
        return self._bootstrap(collector, dispatch, dispatch_set.version)

    def _bootstrap(
        self, collector: Collector, dispatch: list[PublicKey], dispatch_version: int
    ) -> TrustBootstrap:
        now = int(self.clock().timestamp())
        release = self.release_keys()
        bundle = self.authority.bundle()
        return TrustBootstrap(
            collector_id=collector.collector_id,
            status=collector.status,
            cert_chain_pem=self.authority.chain_pem(collector.cert_pem),
            ca_bundle_pem=bundle.pem(),
            trust_version=bundle.version,
            site_id=collector.site_id,
            gateway_addrs=self.config.gateway_addrs,
            gateway_server_name=self.config.gateway_server_name,
            dispatch_keys=[k.to_json() for k in dispatch],
            release_keys=[k.to_json() for k in release.public_keys(now)],
            policy=self.config.policy,
            dispatch_key_version=dispatch_version,
            release_key_version=release.version,
        )

    @property
    def ca_bundle_pem(self) -> str:
        """The Collector CAs, plus the gateway's internal CAs when there are any."""
        return self.authority.bundle().pem()

    # --- approval, status, renewal -----------------------------------------------------------------
    async def approve(self, collector_id: str, actor: str) -> str:
        return await self.store.transition(collector_id, {"pending"}, "active", actor or "operator", {})

    async def deny(self, collector_id: str, actor: str, reason: str) -> str:
        _check_reason(reason)
        return await self.store.transition(
            collector_id, {"pending"}, "denied", actor or "operator", {"reason": reason}
        )

    async def revoke(self, collector_id: str, actor: str, reason: str) -> str:
        """Permanent; the router's fleet service ends sessions and work after calling this."""
        _check_reason(reason)
        return await self.store.transition(
            collector_id, {"pending", "active"}, "revoked", actor or "operator", {"reason": reason}
        )

    async def status(self, collector_id: str) -> Collector:
        return await self.store.get_collector(collector_id)

    async def renew(self, collector_id: str, csr_pem: str) -> tuple[str, dt.datetime]:
        """A new certificate (``config.cert_lifetime``) for the same or a new key of an active collector."""
        collector = await self.store.get_collector(collector_id)
        if collector.status != "active":
            raise FailedPrecondition(
                f"collector {collector_id!r} is {collector.status}", code="collector_not_active"
            )
        csr = validate_csr(csr_pem)
        if csr.collector_id != collector_id:
            raise InvalidArgument(
                "the CSR's Common Name must be the collector's own id", code="csr_cn_mismatch"
            )
        cert = self.authority.issuing().issue(
            csr, site_id=collector.site_id, trust_domain=self.config.trust_domain, now=self.clock(),
            lifetime=self.config.cert_lifetime,
        )  # fmt: skip
        cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
        await self.store.replace_certificate(
            collector_id,
            {
                "public_key_der": csr.public_key_der,
                "public_key_sha256": csr.public_key_sha256,
                "cert_pem": cert_pem,
                "cert_serial": format(cert.serial_number, "x"),
                "cert_not_after": cert.not_valid_after_utc,
            },
        )
        log.info(
            "certificate renewed",
            collector_id=collector_id,
            key_changed=csr.public_key_sha256 != collector.public_key_sha256,
        )
        return self.authority.chain_pem(cert_pem), cert.not_valid_after_utc


def _check_reason(reason: str) -> None:
    if len(reason) > MAX_REASON_LENGTH:
        raise InvalidArgument(f"reason is at most {MAX_REASON_LENGTH} characters", code="reason_too_long")


def _requested_id(csr_pem: str) -> str:
    """The collector id a CSR asks for, for the audit log ("" when the CSR is unreadable)."""
    try:
        return validate_csr(csr_pem).collector_id
    except VersusError:
        return ""
