"""Who may call which RPC: roles, principals and the one policy table.

Every gRPC method of every control-plane service is listed in :data:`POLICY`
with the roles allowed to call it. A method missing from the table is refused
for everybody (fail closed); a unit test checks the table against the
generated service descriptors so a new RPC cannot ship without a decision.

Roles:

- ``viewer``: read the fleet, sites, tokens, the dispatch queue and the audit log;
- ``operator``: viewer plus drain/undrain, resolving indeterminate tasks, cancelling
  tasks and opening tunnels;
- ``collector-admin``: operator plus approve, deny, revoke, vault modes, sites,
  enrollment tokens and API tokens;
- ``platform``: platform modules; submit, watch and cancel tasks and open
  tunnels, nothing else, and only for the tenants the token names (see
  :meth:`Principal.covers`);
- ``service``: internal callers (the gateway) of the collector bridge, the
  tunnel relay and enrollment.

This module does no I/O: the interceptor in :mod:`common.grpc.server` looks the
token up and asks :func:`authorize`.
"""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass

from common.errors import PermissionDenied


class Role(enum.StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    COLLECTOR_ADMIN = "collector-admin"
    PLATFORM = "platform"
    SERVICE = "service"


ALL_TENANTS = "*"
_current: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("versus_principal", default=None)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: the API token it presented, that token's role and tenant scope.

    ``tenants`` is None for a fleet-wide caller (operators, admins, services, and platform
    tokens created before tenant scoping); otherwise the tenants it may act for, where
    :data:`ALL_TENANTS` stands for every tenant.
    """

    token_id: str
    name: str
    role: Role
    tenants: frozenset[str] | None = None

    @property
    def actor(self) -> str:
        """How the caller appears in the audit log."""
        return f"{self.name} ({self.token_id})"

    def covers(self, tenant_id: str) -> bool:
        """Whether this caller may see and act on ``tenant_id``'s tasks, sites and tunnels."""
        return self.tenants is None or ALL_TENANTS in self.tenants or tenant_id in self.tenants


def require_tenant(tenant_id: str) -> None:
    """Refuse the RPC being served unless its caller's scope covers ``tenant_id``."""
    principal = _current.get()
    if principal is not None and not principal.covers(tenant_id):
        raise PermissionDenied(
            f"this API token may not act for tenant {tenant_id!r}", code="tenant_not_in_scope"
        )


def sees_tenant(tenant_id: str) -> bool:
    """Whether the caller of the RPC being served may see ``tenant_id``'s records."""
    principal = _current.get()
    return principal is None or principal.covers(tenant_id)


def tenant_filter() -> frozenset[str] | None:
    """The tenants a listing must be limited to for this caller; None for no limit."""
    principal = _current.get()
    if principal is None or principal.tenants is None or ALL_TENANTS in principal.tenants:
        return None
    return principal.tenants


_VIEW = frozenset({Role.VIEWER, Role.OPERATOR, Role.COLLECTOR_ADMIN})
_OPERATE = frozenset({Role.OPERATOR, Role.COLLECTOR_ADMIN})
_ADMIN = frozenset({Role.COLLECTOR_ADMIN})
_PLATFORM = frozenset({Role.PLATFORM})
_SERVICE = frozenset({Role.SERVICE})

_FLEET = "versus.fleet.v1.FleetService"
_ENROLL = "versus.enrollment.v1.EnrollmentService"
_ROUTER = "versus.router.v1.TaskRouterService"
_BRIDGE = "versus.router.v1.CollectorBridgeService"
_TUNNEL = "versus.router.v1.TunnelService"
_ACCESS = "versus.access.v1.AccessService"
_CREDENTIAL = "versus.credential.v1.CredentialService"

# "/package.Service/Method" -> roles allowed to call it.
POLICY: dict[str, frozenset[Role]] = {
    # Fleet: reads for viewers, drain for operators, identity and vault changes for collector-admins.
    f"/{_FLEET}/GetFleetHealth": _VIEW,
    f"/{_FLEET}/ListCollectors": _VIEW,
    f"/{_FLEET}/GetCollector": _VIEW,
    f"/{_FLEET}/ProbeCollector": _VIEW,
    f"/{_FLEET}/ListReleases": _VIEW,
    f"/{_FLEET}/GetRelease": _VIEW,
    f"/{_FLEET}/DownloadRelease": _VIEW,
    f"/{_FLEET}/ListVaultIntegrations": _VIEW,
    f"/{_FLEET}/DrainCollector": _OPERATE,
    f"/{_FLEET}/UndrainCollector": _OPERATE,
    f"/{_FLEET}/ApproveCollector": _ADMIN,
    f"/{_FLEET}/DenyCollector": _ADMIN,
    f"/{_FLEET}/RevokeCollector": _ADMIN,
    f"/{_FLEET}/SetVaultMode": _ADMIN,
    f"/{_FLEET}/CreateVaultIntegration": _ADMIN,
    f"/{_FLEET}/PublishRelease": _ADMIN,
    f"/{_FLEET}/YankRelease": _ADMIN,
    f"/{_FLEET}/ApplyUpdate": _ADMIN,
    f"/{_FLEET}/CancelUpdate": _ADMIN,
    # Enrollment: the gateway enrolls and renews on behalf of collectors; operators manage sites and tokens.
    f"/{_ENROLL}/Enroll": _SERVICE,
    f"/{_ENROLL}/RenewCertificate": _SERVICE,
    f"/{_ENROLL}/GetEnrollmentStatus": _SERVICE | _VIEW,
    f"/{_ENROLL}/GetSite": _VIEW,
    f"/{_ENROLL}/ListSites": _VIEW,
    f"/{_ENROLL}/ListEnrollmentTokens": _VIEW,
    f"/{_ENROLL}/CreateSite": _ADMIN,
    f"/{_ENROLL}/UpdateSite": _ADMIN,
    f"/{_ENROLL}/DeleteSite": _ADMIN,
    f"/{_ENROLL}/IssueEnrollmentToken": _ADMIN,
    f"/{_ENROLL}/RevokeEnrollmentToken": _ADMIN,
    f"/{_ENROLL}/ApproveCollector": _ADMIN,
    f"/{_ENROLL}/DenyCollector": _ADMIN,
    f"/{_ENROLL}/RevokeCollector": _ADMIN,
    # Tasks: platform modules submit; operators watch the queue and settle what could not be confirmed.
    f"/{_ROUTER}/SubmitTask": _PLATFORM,
    f"/{_ROUTER}/GetTask": _PLATFORM | _VIEW,
    f"/{_ROUTER}/WatchTask": _PLATFORM | _VIEW,
    f"/{_ROUTER}/ReadOutput": _PLATFORM | _VIEW,
    f"/{_ROUTER}/CancelTask": _PLATFORM | _OPERATE,
    f"/{_ROUTER}/RetryTask": _OPERATE,
    f"/{_ROUTER}/ListTasks": _PLATFORM | _VIEW,
    f"/{_ROUTER}/ListDispatches": _VIEW,
    f"/{_ROUTER}/GetDispatch": _VIEW,
    f"/{_ROUTER}/ResolveIndeterminate": _OPERATE,
    # Collector traffic, relayed by the gateway only.
    f"/{_BRIDGE}/Claim": _SERVICE,
    f"/{_BRIDGE}/Report": _SERVICE,
    f"/{_BRIDGE}/PublishCapabilities": _SERVICE,
    f"/{_BRIDGE}/Goodbye": _SERVICE,
    f"/{_BRIDGE}/AppendOutput": _SERVICE,
    f"/{_BRIDGE}/AckRevocation": _SERVICE,
    f"/{_BRIDGE}/Exchange": _SERVICE,
    # Credentials: operators (and platforms, for their tenants' tasks) take them back from running work.
    f"/{_CREDENTIAL}/RevokeCredential": _PLATFORM | _OPERATE,
    # Vault mode B's store: platforms (for their tenants) and collector-admins write; values never read.
    f"/{_CREDENTIAL}/PutCredential": _PLATFORM | _ADMIN,
    f"/{_CREDENTIAL}/DeleteCredential": _PLATFORM | _ADMIN,
    f"/{_CREDENTIAL}/ListCredentials": _PLATFORM | _VIEW,
    f"/{_CREDENTIAL}/RewrapCredentials": _ADMIN,
    f"/{_CREDENTIAL}/GetRevocation": _PLATFORM | _VIEW,
    f"/{_CREDENTIAL}/ListRevocations": _PLATFORM | _VIEW,
    f"/{_TUNNEL}/OpenTunnel": _PLATFORM | _OPERATE,
    # API tokens and audit.
    f"/{_ACCESS}/CreateApiToken": _ADMIN,
    f"/{_ACCESS}/ListApiTokens": _ADMIN,
    f"/{_ACCESS}/RevokeApiToken": _ADMIN,
    f"/{_ACCESS}/ListAuditEvents": _VIEW,
    f"/{_ACCESS}/WhoAmI": frozenset(Role),
}


def authorize(principal: Principal, method: str) -> None:
    """Raise :class:`PermissionDenied` unless ``principal`` may call ``method`` ("/pkg.Service/Method")."""
    allowed = POLICY.get(method)
    if allowed is None or principal.role not in allowed:
        name = method.rsplit("/", 1)[-1]
        raise PermissionDenied(f"role {principal.role.value!r} may not call {name}", code="permission_denied")


def bind(principal: Principal | None) -> contextvars.Token[Principal | None]:
    return _current.set(principal)


def unbind(token: contextvars.Token[Principal | None]) -> None:
    """Restore the principal bound before ``token``.

    A streaming handler that the client abandons is finalised by the event loop in a task of
    its own, hence another Context: there is nothing to restore then, and that is no error.
    """
    try:
        _current.reset(token)
    except ValueError:
        _current.set(None)


def current() -> Principal | None:
    """The principal of the RPC being served, if any."""
    return _current.get()


def current_actor(default: str = "system") -> str:
    """The audit-log actor for the RPC being served; ``default`` outside an RPC (sweeps, startup)."""
    principal = _current.get()
    return principal.actor if principal is not None else default
