"""What the dispatch layers share on top of :class:`router.core.base.RouterCore`: the dispatch keys,
placement's candidate cache, per-claim bookkeeping, and the types and limits of a claim's answer
(router/dispatch/service.py puts the layers together)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from common.errors import FailedPrecondition
from common.protocol import features_floor
from common.redis.keys import CANDIDATES_CHANGED
from common.trust.keys import KeySet
from router.core.base import RouterCore
from router.core.states import State
from router.dispatch import ladder
from router.dispatch.candidates import CandidateLoader
from router.dispatch.submit import SubmitRequest
from router.trust import fleet_news
from router.trust.delivery import TrustDelivery
from router.trust.key_chains import PURPOSES, KeyChains

# Bound on the report-key cache; past it the cache starts over (one PostgreSQL read per collector).
MAX_CACHED_REPORT_KEYS = 100_000

# How long a leased dispatch waits to be claimed; its envelope expires then too.
DISPATCH_TTL_S = 300
MAX_CLAIM_WAIT_S = 30.0
NO_ELIGIBLE = "no_eligible_collector"
# Eligible collectors exist, but none holds a dispatch key the router still has (docs/envelope.md).
NO_KEY_HELD = "no_collector_holds_a_live_dispatch_key"


class DeviceLeased(FailedPrecondition):
    default_code = "device_leased"


@dataclass(frozen=True, slots=True)
class Claimed:
    """A dispatch handed to its collector."""

    dispatch_id: str
    envelope: bytes
    # Vault mode B: the signed document relaying its device credential (JSON), if any.
    credential: str | None = None
    # The lease span's trace context, which the gateway's hand-out span continues ("": untraced).
    traceparent: str = ""


Offer = Mapping[str, Any]


# A signed document in its wire form (common/trust/signed_doc.py).
SignedDoc = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    """What one claim hands the collector: dispatches, offers, a config to restart with, and
    verdicts on tasks it holds (dispatch id -> "continue", "cancel" or "terminate")."""

    claimed: tuple[Claimed, ...] = ()
    offers: tuple[Offer, ...] = ()
    restart: SignedDoc | None = None
    verdicts: Mapping[str, str] = field(default_factory=dict)
    # Credential revocations for tasks it runs (router/credentials/revocations.py ``revokes_for``).
    revokes: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ReportResult:
    duplicate: bool
    state: State


def _task_values(req: SubmitRequest, digest: bytes, traceparent: str = "") -> dict[str, Any]:
    return {
        "traceparent": traceparent or None,
        "task_id": f"tsk-{secrets.token_hex(10)}",
        "idempotency_key": req.idempotency_key,
        "request_sha256": digest,
        "provider": req.provider,
        "operation": req.operation,
        "op_class": req.op_class,
        "target_ref": req.target_ref,
        "site_id": req.site_id,
        "tenant_id": req.tenant_id,
        "params": req.params,
        "deadline": req.deadline,
        "requires_fips": req.requires_fips,
        "labels": dict(req.labels),
        "features": list(req.features),
        "protocol_floor": features_floor(req.features)[0],
        "state": State.QUEUED.value,
    }


# Queued tasks looked at per re-evaluation: a sweep or a collector coming back, and a freed slot.
REEVALUATE_BATCH = 100
FREED_SLOT_BATCH = 8


class DispatchCore(RouterCore):
    """The state the dispatch layers share: keys to sign envelopes with, the ladder's bound, the
    candidate cache and what each claim in progress has noted."""

    def __init__(
        self,
        engine: AsyncEngine,
        redis: Redis,
        dispatch_keys: Callable[[], KeySet],
        *,
        max_attempts: int = ladder.DEFAULT_MAX_ATTEMPTS,
        dispatch_ttl_s: int = DISPATCH_TTL_S,
    ):
        super().__init__(engine, redis)
        # Each envelope is signed with a key its collector holds (KeySet.signing_key_for).
        self.dispatch_keys = dispatch_keys
        # Collectors' public keys, to verify their reports (read from PostgreSQL on a miss).
        self._report_keys: dict[str, ec.EllipticCurvePublicKey] = {}
        self.max_attempts = max_attempts
        self.dispatch_ttl_s = dispatch_ttl_s
        self.candidates = CandidateLoader(redis, self.in_flight, self.liveness.window_s, self.clock.now)
        # Set by the server: the key sets' rotation chains (router/trust/key_chains.py).
        self.key_chains: KeyChains | None = None
        # Set by the server: newer trust bundles for collectors behind (router/trust/delivery.py).
        self.trust: TrustDelivery | None = None
        # Per claim in progress: whether the collector has dispatches from earlier claims unreported
        # (read with its standing; router/dispatch/handout.py).
        self._unanswered: dict[str, bool] = {}
        # The dispatch key version each collector was last recorded as holding (saves a write per claim).
        self._held_dispatch_version: dict[str, int] = {}
        # The numbered claim of each collector that arrived last in this process
        # (router/dispatch/handout.py ``_claim_in_progress``): another one still held here was
        # abandoned and takes no work.
        self._live_claim: dict[str, object] = {}
        # How often rotations are looked for (router/trust/fleet_news.py); set before start().
        self.fleet_news_every_s = fleet_news.CHECK_EVERY_S

    def candidates_changed(self) -> None:
        """Forget cached candidate rows in this process now and in every other router replica
        (each caches a site's rows for a second: router/dispatch/candidates.py)."""
        self.candidates.invalidate()
        self._spawn(self.wake.publish_many([CANDIDATES_CHANGED]))

    async def follow_candidate_changes(self) -> None:
        """Until cancelled: forget cached candidate rows whenever a replica says they changed."""
        async with self.wake.listening(CANDIDATES_CHANGED) as changed:
            while True:
                await changed.wait()
                changed.clear()
                self.candidates.invalidate()

    def start(self) -> None:
        """Start the shared listeners, follow other replicas' cache invalidations, and announce
        key set and trust bundle rotations to the gateways (router/trust/fleet_news.py)."""
        super().start()
        self._spawn(self.follow_candidate_changes())
        self._spawn(fleet_news.follow(self.redis, self.fleet_versions, self.fleet_news_every_s))

    def fleet_versions(self) -> dict[str, int]:
        """The newest key set and trust bundle versions a claim is compared with."""
        out: dict[str, int] = {}
        if self.key_chains is not None:
            out.update((p.value, self.key_chains.newest(p)) for p in PURPOSES)
        if self.trust is not None:
            out["trust"] = self.trust.bundles.get().version
        return out
