"""What the console's pages show, as plain dataclasses, and the one conversion from the fleet
API's messages into them (the edge: templates and handlers never touch protobuf)."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from versus.fleet.v1 import fleet_pb2 as pb

from common.access import rbac

STATUS = {
    pb.COLLECTOR_STATUS_PENDING: "pending",
    pb.COLLECTOR_STATUS_ACTIVE: "active",
    pb.COLLECTOR_STATUS_REVOKED: "revoked",
    pb.COLLECTOR_STATUS_EXPIRED: "expired",
    pb.COLLECTOR_STATUS_DENIED: "denied",
}
SESSION = {
    pb.SESSION_STATE_ACTIVE: "active",
    pb.SESSION_STATE_STALE: "stale",
    pb.SESSION_STATE_DRAINING: "draining",
    pb.SESSION_STATE_DEAD: "dead",
    pb.SESSION_STATE_OFFLINE: "offline",
}
VAULT = {
    pb.VAULT_MODE_LOCAL: "A — Local Vault",
    pb.VAULT_MODE_CLOUD_RELAYED: "B — Cloud-Relayed",
    pb.VAULT_MODE_EXTERNAL: "C — External Secret Manager",
}
# The vault-mode switch's values (the form's), to and from the API's enum.
VAULT_NAME = {
    pb.VAULT_MODE_LOCAL: "local",
    pb.VAULT_MODE_CLOUD_RELAYED: "cloud_relayed",
    pb.VAULT_MODE_EXTERNAL: "external",
}
BADGE = {
    pb.UPDATE_BADGE_UP_TO_DATE: "Up to date",
    pb.UPDATE_BADGE_UPDATE_AVAILABLE: "Update available",
    pb.UPDATE_BADGE_UPDATING: "Updating…",
    pb.UPDATE_BADGE_FAILED: "Update failed",
    pb.UPDATE_BADGE_ROLLED_BACK: "Rolled back",
}
_FLEET = "/versus.fleet.v1.FleetService/"
# Each action a page offers, and the RPC whose policy decides who sees it.
ACTION_RPC = {
    "approve": _FLEET + "ApproveCollector",
    "deny": _FLEET + "DenyCollector",
    "probe": _FLEET + "ProbeCollector",
    "drain": _FLEET + "DrainCollector",
    "undrain": _FLEET + "UndrainCollector",
    "revoke": _FLEET + "RevokeCollector",
    "apply_update": _FLEET + "ApplyUpdate",
    "cancel_update": _FLEET + "CancelUpdate",
    "vault": _FLEET + "SetVaultMode",
    "create_vault_integration": _FLEET + "CreateVaultIntegration",
    "publish": _FLEET + "PublishRelease",
    "yank": _FLEET + "YankRelease",
    "resolve": "/versus.router.v1.TaskRouterService/ResolveIndeterminate",
    "cancel_task": "/versus.router.v1.TaskRouterService/CancelTask",
    "retry_task": "/versus.router.v1.TaskRouterService/RetryTask",
    "site_policy": "/versus.enrollment.v1.EnrollmentService/UpdateSite",
    "issue_token": "/versus.enrollment.v1.EnrollmentService/IssueEnrollmentToken",
    "revoke_token": "/versus.enrollment.v1.EnrollmentService/RevokeEnrollmentToken",
}


@dataclass(frozen=True)
class Identity:
    """Who an API token belongs to (WhoAmI)."""

    name: str
    role: str
    tenants: tuple[str, ...]


def may(role: str, action: str) -> bool:
    """Whether ``role`` may take ``action`` by the services' own policy table (the console
    only hides what the services would refuse; they still decide every call)."""
    allowed = rbac.POLICY.get(ACTION_RPC[action], frozenset())
    return any(r.value == role for r in allowed)


@dataclass(frozen=True)
class Operation:
    name: str
    op_class: str
    timeout_s: int
    parallel_safe: bool


@dataclass(frozen=True)
class Driver:
    provider: str
    max_concurrency: int
    operations: list[Operation]


@dataclass(frozen=True)
class CollectorView:
    collector_id: str
    site_id: str
    hostname: str
    os: str
    arch: str
    version: str
    fips: bool
    status: str
    session: str
    drained: bool
    cert_serial: str
    cert_fingerprint: str
    cert_not_after: str
    enrolled_at: str
    session_id: str
    established_at: str
    heartbeat_age: str
    transport: str
    queue_depth: int
    vault_mode: str
    running_vault_mode: str
    update_badge: str
    latest_version: str
    update_policy: str
    target_version: str = ""
    approved_version: str = ""  # an operator's approval the collector has not applied yet
    vault_mode_name: str = ""  # the recorded mode as SetVaultMode names it (local, cloud_relayed, external)
    drivers: list[Driver] = field(default_factory=list)

    @property
    def update_available(self) -> bool:
        return self.update_badge == "Update available"

    @property
    def update_pending(self) -> bool:
        """An update was approved and the collector has not installed it: it can be cancelled."""
        return bool(self.approved_version) and self.approved_version != self.version


@dataclass(frozen=True)
class AuditEntry:
    at: str
    actor: str
    action: str
    subject_type: str
    subject_id: str
    details: str  # JSON, integers as integers


@dataclass(frozen=True)
class AuditPage:
    events: list[AuditEntry]
    next_page_token: str


@dataclass(frozen=True)
class CollectorFilters:
    """The Collectors page's search and filters, as the query string carries them."""

    q: str = ""
    site: str = ""
    status: str = ""  # a value of STATUS, or empty: any
    session: str = ""  # a value of SESSION, or empty: any
    version: str = ""
    driver: str = ""
    outdated: str = ""  # "1": only collectors behind the latest release (the Releases page's link)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> CollectorFilters:
        """Bounded, and an unknown status or session is no filter (the form only offers known ones)."""
        status, session = params.get("status", ""), params.get("session", "")
        return cls(
            q=params.get("q", "")[:200],
            site=params.get("site", "")[:200],
            status=status if status in STATUS.values() else "",
            session=session if session in SESSION.values() else "",
            version=params.get("version", "")[:100],
            driver=params.get("driver", "")[:100],
            outdated="1" if params.get("outdated") == "1" else "",
        )

    def query(self, page: str = "") -> str:
        """The query string of these filters (and a page), for links."""
        values = {k: v for k, v in asdict(self).items() if v}
        if page:
            values["page"] = page
        return urllib.parse.urlencode(values)


@dataclass(frozen=True)
class CollectorPage:
    collectors: list[CollectorView]
    next_page_token: str
    outdated_count: int


def timestamp(ts: Any) -> str:
    """A protobuf Timestamp as operators read it (empty when unset)."""
    if not ts.seconds and not ts.nanos:
        return ""
    return dt.datetime.fromtimestamp(ts.seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def collector_view(c: pb.Collector) -> CollectorView:
    """The view of one ``fleet.v1.Collector`` message."""
    s = c.session
    age = f"{s.heartbeat_age_s} s" if s.HasField("heartbeat_age_s") else "never"
    return CollectorView(
        collector_id=c.collector_id, site_id=c.site_id, hostname=c.hostname, os=c.os, arch=c.arch,
        version=c.agent_version, fips=c.fips, status=STATUS.get(c.status, "unknown"),
        session=SESSION.get(c.session_state, "dead"), drained=c.drained, cert_serial=c.cert_serial,
        cert_fingerprint=c.cert_fingerprint_sha256, cert_not_after=timestamp(c.cert_not_after),
        enrolled_at=timestamp(c.enrolled_at), session_id=s.session_id,
        established_at=timestamp(s.established_at),
        heartbeat_age=age, transport=s.transport, queue_depth=c.queue_depth,
        vault_mode=VAULT.get(c.vault_mode, "—"), running_vault_mode=VAULT.get(s.vault_mode, "—"),
        update_badge=BADGE.get(c.update.badge, "") if c.HasField("update") else "",
        latest_version=c.update.latest_version if c.HasField("update") else "",
        update_policy=c.update.policy if c.HasField("update") else "",
        target_version=c.update.target_version if c.HasField("update") else "",
        approved_version=c.update.approved_version if c.HasField("update") else "",
        vault_mode_name=VAULT_NAME.get(c.vault_mode, ""),
        drivers=[
            Driver(d.provider, d.max_concurrency,
                   [Operation(o.name, o.op_class, o.timeout_s, o.parallel_safe) for o in d.operations])
            for d in c.drivers
        ],
    )  # fmt: skip
