"""Fleet management: the operator's view of collectors and the actions on them.

Status lives in PostgreSQL, written only by the enrollment service (approve,
deny and revoke go through its RPCs, as the operator who asked:
:mod:`router.fleet.enrollment_client`); drain and vault settings are the router's own
columns. Session health lives in Redis (written by every claim); :mod:`router.core.fleet_state`
turns both into the two state machines. Every accepted action writes an audit row with the
caller, and the state before and after, in the same transaction as the change.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from sqlalchemy.engine import RowMapping

from common.access.rbac import current_actor
from common.errors import FailedPrecondition, InvalidArgument, Unavailable
from common.redis import revocations
from router.core import audit, fleet_state
from router.core.fleet_state import CollectorStatus, Probe, SessionState
from router.credentials import vault_secrets
from router.credentials.vault import MasterKeys
from router.dispatch.service import Router
from router.fleet import store as fleet_store
from router.fleet.enrollment_client import EnrollmentClient, Metadata
from router.releases import store as release_store
from router.releases import update_policy
from router.releases.update_policy import Badge
from router.releases.updates import collector_facts, release_facts

VAULT_MODES = ("local", "relayed", "external")


@dataclass(frozen=True)
class SessionView:
    state: SessionState
    session_id: str
    established_at: float | None
    last_heartbeat: float | None
    heartbeat_age_s: float | None
    transport: str
    vault_mode: str
    agent_version: str
    self_draining: bool
    # Key set versions the running process holds ({"dispatch": 3, "release": 2}); empty: not said.
    key_versions: dict[str, int] = field(default_factory=dict)
    # The collector protocol version settled on its last claim (0: unknown); docs/protocol.md.
    protocol_version: int = 0
    # Why it said goodbye, while it is offline.
    goodbye_reason: str = ""


@dataclass(frozen=True)
class UpdateView:
    """The Agent Version card: what runs, what is published, the policy, and how the upgrade goes."""

    running_version: str
    latest_version: str
    policy: str
    channel: str
    target_version: str
    approved_version: str
    badge: Badge
    state: str
    state_version: str
    detail: str
    state_at: dt.datetime | None


@dataclass(frozen=True)
class CollectorView:
    row: RowMapping
    status: CollectorStatus
    drained: bool
    session: SessionView
    queue_depth: int
    update: UpdateView | None = None

    @property
    def collector_id(self) -> str:
        return str(self.row["collector_id"])


FILTER_READ_ROWS = 500


@dataclass(frozen=True, slots=True)
class ListFilters:
    """What the collector list keeps beyond its SQL filters, judged on each view: the effective
    status, the session state now, the running version and whether it is behind its release."""

    outdated: bool = False
    status: CollectorStatus | None = None
    session: SessionState | None = None
    version: str = ""

    @property
    def stored_status(self) -> tuple[str, ...]:
        """The stored statuses that can have the effective one (narrows the SQL)."""
        if self.status is None:
            return ()
        if self.status is CollectorStatus.EXPIRED:
            return (CollectorStatus.PENDING.value, CollectorStatus.ACTIVE.value)
        return (self.status.value,)

    @property
    def on_views(self) -> bool:
        return self.outdated or self.status is not None or self.session is not None or bool(self.version)

    def keeps(self, view: CollectorView) -> bool:
        if self.status is not None and view.status is not self.status:
            return False
        if self.session is not None and view.session.state is not self.session:
            return False
        running = view.update.running_version if view.update is not None else ""
        if self.version and running != self.version:
            return False
        return not self.outdated or (
            view.status is CollectorStatus.ACTIVE
            and view.update is not None
            and update_policy.outdated(view.update.running_version, view.update.latest_version)
        )


def _int(value: str | None) -> int:
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


class Fleet:
    def __init__(self, router: Router, clock: Callable[[], float] = time.time):
        self.router = router
        self.engine = router.engine
        self.clock = clock

    @property
    def enrollment(self) -> EnrollmentClient:
        client: EnrollmentClient | None = self.router.enrollment
        if client is None:
            raise Unavailable("this router has no enrollment service address", code="enrollment_unavailable")
        return client

    # --- views ---------------------------------------------------------------------------------
    async def _releases(self) -> Sequence[RowMapping]:
        async with self.engine.connect() as conn:
            return await release_store.live_releases(conn)

    async def _views(self, rows: Sequence[RowMapping]) -> list[CollectorView]:
        releases = await self._releases() if rows else ()
        now = self.clock()
        wall = dt.datetime.fromtimestamp(now, dt.UTC)
        ids = [r["collector_id"] for r in rows]
        loads = await self.router.in_flight.get(ids) if ids else {}
        views = []
        sessions = await self.router.liveness.sessions(ids)
        for row in rows:
            cid = row["collector_id"]
            last, details = sessions[cid]
            drained = bool(row["draining"])
            self_draining = details.get("draining") == "1"
            age = fleet_state.heartbeat_age(last, now)
            said_goodbye = "bye_at" in details
            session = SessionView(
                state=fleet_state.session_state(last, drained or self_draining, now, said_goodbye),
                session_id=details.get("session_id", ""),
                established_at=_float(details.get("established_at")),
                last_heartbeat=last,
                heartbeat_age_s=age,
                transport=details.get("transport", ""),
                vault_mode=details.get("vault_mode", ""),
                agent_version=details.get("agent_version", ""),
                self_draining=self_draining,
                key_versions=_key_versions(details.get("key_versions", "")),
                protocol_version=_int(details.get("protocol")),
                goodbye_reason=details.get("bye_reason", "") if said_goodbye else "",
            )
            views.append(
                CollectorView(
                    row=row,
                    status=fleet_state.collector_status(row["status"], row["cert_not_after"], wall),
                    drained=drained,
                    session=session,
                    queue_depth=sum(loads.get(cid, {}).values()),
                    update=_update_view(row, session.agent_version, releases),
                )
            )
        return views

    async def outdated_count(
        self, *, query: str, site_id: str, expiring_within: dt.timedelta | None = None
    ) -> int:
        """Active collectors matching the filters that run an older version than the latest release
        on their site's channel (the Collectors page's banner)."""
        releases = await self._releases()
        async with self.engine.connect() as conn:
            rows = await fleet_store.list_collectors(
                conn, query=query, site_id=site_id, after="", limit=0, expiring_within=expiring_within,
                columns=fleet_store.OUTDATED_COLUMNS,
            )  # fmt: skip
        return sum(1 for r in rows if r["status"] == "active" and _behind(r, r["running"] or "", releases))

    async def list(
        self,
        *,
        query: str,
        site_id: str,
        after: str,
        limit: int,
        expiring_within: dt.timedelta | None = None,
        driver: str = "",
        filters: ListFilters = ListFilters(),
    ) -> list[CollectorView]:
        """Up to ``limit`` collectors after ``after``. ``filters`` are checked on each page read
        (status, session and version live partly in Redis), so several pages may be read to fill
        one; ``driver`` and the rest narrow the SQL."""
        found: list[CollectorView] = []
        # Filtered on the views, a page may need many rows read: in reads of at least
        # FILTER_READ_ROWS (a rare state across 10,000 collectors: 20 reads, not 200).
        chunk = max(limit, FILTER_READ_ROWS) if filters.on_views else limit
        among = await self._heard_in_window(filters.session)
        if among is not None and not among:
            return []
        while len(found) < limit:
            async with self.engine.connect() as conn:
                rows = await fleet_store.list_collectors(
                    conn, query=query, site_id=site_id, after=after, limit=chunk,
                    expiring_within=expiring_within, stored_status=filters.stored_status, driver=driver,
                    among=among,
                )  # fmt: skip
            views = await self._views(rows)
            found.extend(v for v in views if filters.keeps(v))
            if len(rows) < chunk or not filters.on_views:
                break
            after = rows[-1]["collector_id"]
        return found[:limit]

    async def _heard_in_window(self, session: SessionState | None) -> Sequence[str] | None:
        """For a session state that needs a recent heartbeat, the collectors heard in its window
        (a second wider each side; the views judge exactly), so a rare state is found without
        reading every row; None: any collector may be in it."""
        now = self.clock()
        window = {
            SessionState.ACTIVE: (now - fleet_state.STALE_AFTER_S, now),
            SessionState.STALE: (now - fleet_state.DEAD_AFTER_S, now - fleet_state.STALE_AFTER_S),
            SessionState.DRAINING: (now - fleet_state.DEAD_AFTER_S, now),
        }.get(session) if session is not None else None  # fmt: skip
        if window is None:
            return None
        oldest, newest = window
        return await self.router.liveness.heard_between(oldest - 1.0, newest + 1.0)

    async def get(self, collector_id: str) -> CollectorView:
        async with self.engine.connect() as conn:
            row = await fleet_store.get_collector(conn, collector_id)
        return (await self._views([row]))[0]

    async def probe(self, collector_id: str) -> tuple[Probe, int]:
        """Reachability from the last heartbeat (no round trip to the collector) and the queue depth."""
        view = await self.get(collector_id)
        result = fleet_state.probe(
            view.session.last_heartbeat,
            view.drained or view.session.self_draining,
            self.clock(),
            view.session.state is SessionState.OFFLINE,
        )
        return result, view.queue_depth

    # --- actions -------------------------------------------------------------------------------
    async def _set_drained(self, collector_id: str, drained: bool) -> CollectorView:
        async with self.engine.begin() as conn:
            row = await fleet_store.get_collector(conn, collector_id, lock=True)
            before = bool(row["draining"])
            if before != drained:
                await fleet_store.set_drained(conn, collector_id, drained)
                await audit.record(
                    conn, current_actor(), "collector.drain" if drained else "collector.undrain",
                    "collector", collector_id, {"before": {"drained": before}, "after": {"drained": drained}},
                )  # fmt: skip
        # Cached candidate rows (here and in other replicas) still say the old drain state.
        self.router.candidates_changed()
        if not drained:
            # Routing is back: place what waited for this collector's site.
            await self.router.reevaluate(row["site_id"])
        return await self.get(collector_id)

    async def drain(self, collector_id: str) -> CollectorView:
        """No new work is placed on the collector from now on; in-flight work finishes."""
        return await self._set_drained(collector_id, True)

    async def undrain(self, collector_id: str) -> CollectorView:
        return await self._set_drained(collector_id, False)

    async def approve(self, collector_id: str, caller: Metadata) -> CollectorView:
        await self.enrollment.approve(collector_id, caller)
        return await self.get(collector_id)

    async def deny(self, collector_id: str, reason: str, caller: Metadata) -> CollectorView:
        await self.enrollment.deny(collector_id, reason, caller)
        return await self.get(collector_id)

    async def revoke(self, collector_id: str, reason: str, caller: Metadata) -> CollectorView:
        """Permanent. The gateway refuses the identity from its next request; sessions and tunnels end."""
        await self.enrollment.revoke(collector_id, reason, caller)
        await self.router.collector_removed(collector_id)
        await revocations.announce(self.router.redis, collector_id)
        return await self.get(collector_id)

    async def set_vault_mode(
        self, collector_id: str, mode: str, integration_id: str, secret_id: str = ""
    ) -> CollectorView:
        """Record the mode; a connected collector learns it from its next (or held) claim and restarts.

        Mode C (``external``) takes the collector's AppRole secret id (or its wrapping token):
        required on entering the mode or changing integration, optional otherwise (empty keeps
        the current one). It is sealed under the credentials master key
        (router/credentials/vault_secrets.py)."""
        if mode not in VAULT_MODES:
            raise InvalidArgument(
                f"vault mode must be one of {', '.join(VAULT_MODES)}", code="vault_mode_invalid"
            )
        if (mode == "external") != bool(integration_id):
            raise InvalidArgument(
                "vault mode external needs an integration id, and only it takes one",
                code="vault_integration_required" if mode == "external" else "vault_integration_unexpected",
            )
        if secret_id and mode != "external":
            raise InvalidArgument(
                "only vault mode external takes a secret id", code="vault_secret_id_unexpected"
            )
        try:
            secret = vault_secrets.check_secret(secret_id) if secret_id else ""
        except ValueError as exc:
            raise InvalidArgument(str(exc), code="vault_secret_id_invalid") from None
        async with self.engine.begin() as conn:
            row = await fleet_store.get_collector(conn, collector_id, lock=True)
            if row["status"] in ("revoked", "denied"):
                raise FailedPrecondition(f"collector is {row['status']}", code="collector_wrong_status")
            if integration_id:
                await fleet_store.get_integration(conn, integration_id)
            keeps = row["vault_integration_id"] == integration_id and row["vault_secret"] is not None
            if mode == "external" and not secret and not keeps:
                raise InvalidArgument(
                    "vault mode external needs the collector's AppRole secret id (a wrapping token "
                    "where the integration delivers them wrapped)",
                    code="vault_secret_id_required",
                )
            version = int(row["vault_secret_version"]) + (1 if secret else 0)
            before = {"vault_mode": row["vault_mode"], "vault_integration_id": row["vault_integration_id"],
                      "vault_secret_version": int(row["vault_secret_version"])}  # fmt: skip
            after = {"vault_mode": mode, "vault_integration_id": integration_id or None,
                     "vault_secret_version": version}  # fmt: skip
            if before != after:
                stored = row["vault_secret"] if mode == "external" and not secret else None
                if secret:
                    stored = vault_secrets.seal_stored(self._master(), collector_id, version, secret)
                await fleet_store.set_vault(conn, collector_id, mode, integration_id or None, stored, version)
                # The secret itself is never audited: the version says it was replaced.
                await audit.record(
                    conn, current_actor(), "collector.vault_mode", "collector", collector_id,
                    {"before": before, "after": after},
                )  # fmt: skip
        # Placement reads the mode from its candidate rows (vault mode B relays credentials).
        self.router.candidates_changed()
        if before != after:
            await self.router.collector_vault_mode_changed(collector_id)
        # A held claim wakes, sees the new mode and tells the collector to restart.
        await self.router.wake.publish(collector_id)
        return await self.get(collector_id)

    def _master(self) -> MasterKeys:
        store = self.router.credential_store
        if store is None:
            raise FailedPrecondition("this router has no credentials master key", code="vault_unavailable")
        master: MasterKeys = store.master
        return master

    async def create_integration(self, values: dict[str, str]) -> RowMapping:
        for key in ("name", "address", "role_id", "kv_mount", "path_prefix"):
            if not values.get(key, "").strip() or len(values[key]) > 500:
                raise InvalidArgument(f"{key} is required (at most 500 characters)", code=f"{key}_invalid")
        if not values["address"].startswith("https://"):
            raise InvalidArgument("the vault address must be an https:// URL", code="address_invalid")
        if any(part in ("", ".", "..") for part in values["path_prefix"].split("/")):
            raise InvalidArgument(
                "path_prefix must be a KV path such as versus/devices", code="path_prefix_invalid"
            )
        if values.get("secret_id_delivery") not in vault_secrets.DELIVERIES:
            raise InvalidArgument(
                "secret id delivery must be wrapped or plain", code="secret_id_delivery_invalid"
            )
        if values.get("ca_pem"):
            try:
                x509.load_pem_x509_certificates(values["ca_pem"].encode())
            except ValueError:
                raise InvalidArgument("ca_pem must hold PEM certificates", code="ca_pem_invalid") from None
        async with self.engine.begin() as conn:
            row = await fleet_store.create_integration(conn, values)
            details: dict[str, Any] = {
                "after": {
                    k: values[k] for k in ("name", "address", "kv_mount", "path_prefix", "secret_id_delivery")
                }
            }
            await audit.record(
                conn, current_actor(), "vault_integration.create", "vault_integration", row["integration_id"],
                details,
            )  # fmt: skip
        return row

    async def integrations(self) -> Sequence[RowMapping]:
        async with self.engine.connect() as conn:
            return await fleet_store.list_integrations(conn)


def _latest(row: RowMapping, releases: Sequence[RowMapping]) -> str:
    newest = update_policy.latest(release_facts(releases, row["os"], row["arch"]), row["update_channel"])
    return newest.version if newest else ""


def _behind(row: RowMapping, running: str, releases: Sequence[RowMapping]) -> bool:
    return update_policy.outdated(running, _latest(row, releases))


def _update_view(row: RowMapping, session_version: str, releases: Sequence[RowMapping]) -> UpdateView:
    running = session_version or row["running_version"] or row["agent_version"] or ""
    facts = collector_facts({**row, "running": running, "state": row["update_state"],
                             "state_version": row["update_state_version"]})  # fmt: skip
    latest = _latest(row, releases)
    target = row["target_version"] or ""
    return UpdateView(
        running_version=running,
        latest_version=latest,
        policy=facts.policy,
        channel=facts.channel,
        target_version=target,
        approved_version=row["approved_version"] or "",
        badge=update_policy.badge(facts, latest or None, target or None),
        state=row["update_state"] or "",
        state_version=row["update_state_version"] or "",
        detail=row["update_detail"] or "",
        state_at=row["update_state_at"],
    )


def _key_versions(text: str) -> dict[str, int]:
    """``"dispatch=3,release=2"`` as a dict; anything malformed is left out."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name and value.isdigit():
            out[name] = int(value)
    return out
