"""Sites and enrollment tokens as the console shows them, and the conversion from the
enrollment service's messages (the edge: pages never see protobuf)."""

from __future__ import annotations

from dataclasses import dataclass

from versus.enrollment.v1 import enrollment_pb2 as pb

from console.views import timestamp

POLICIES = {
    "manual": pb.UPDATE_POLICY_MANUAL,
    "auto": pb.UPDATE_POLICY_AUTO,
    "pinned": pb.UPDATE_POLICY_PINNED,
}
CHANNELS = {"stable": pb.UPDATE_CHANNEL_STABLE, "beta": pb.UPDATE_CHANNEL_BETA}
APPROVALS = {"auto": pb.APPROVAL_MODE_AUTO, "manual": pb.APPROVAL_MODE_MANUAL}
_POLICY_NAMES = {v: k for k, v in POLICIES.items()}
_CHANNEL_NAMES = {v: k for k, v in CHANNELS.items()}
_APPROVAL_NAMES = {v: k for k, v in APPROVALS.items()}
_TOKEN_STATUS = {
    pb.TOKEN_STATUS_ACTIVE: "active",
    pb.TOKEN_STATUS_EXHAUSTED: "exhausted",
    pb.TOKEN_STATUS_EXPIRED: "expired",
    pb.TOKEN_STATUS_REVOKED: "revoked",
}


@dataclass(frozen=True)
class SiteView:
    site_id: str
    name: str
    tenant_id: str
    policy: str
    pinned_version: str
    channel: str
    collector_count: int
    created_at: str


@dataclass(frozen=True)
class TokenView:
    token_id: str
    prefix: str
    status: str
    uses: int
    max_uses: int
    approval: str
    expires_at: str
    created_at: str

    @property
    def remaining(self) -> int:
        return max(self.max_uses - self.uses, 0)


@dataclass(frozen=True)
class IssuedToken:
    """A token just issued: its plaintext and enroll command are shown this once, never again."""

    token: TokenView
    plaintext: str
    enroll_command: str

    def __repr__(self) -> str:  # the plaintext is a secret
        return f"IssuedToken({self.token.token_id!r})"


def site_view(s: pb.Site) -> SiteView:
    return SiteView(
        site_id=s.site_id, name=s.name, tenant_id=s.tenant_id,
        policy=_POLICY_NAMES.get(s.update_policy, "manual"),
        pinned_version=s.pinned_version, channel=_CHANNEL_NAMES.get(s.update_channel, "stable"),
        collector_count=s.collector_count, created_at=timestamp(s.created_at),
    )  # fmt: skip


def token_view(t: pb.EnrollmentToken) -> TokenView:
    return TokenView(
        token_id=t.token_id, prefix=t.display_prefix, status=_TOKEN_STATUS.get(t.status, "unknown"),
        uses=t.uses, max_uses=t.max_uses, approval=_APPROVAL_NAMES.get(t.approval_mode, "auto"),
        expires_at=timestamp(t.expires_at), created_at=timestamp(t.created_at),
    )  # fmt: skip
