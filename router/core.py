"""The router's shared state and types: one :class:`RouterCore` per process, extended by the
placement, hand-out, outcome, report and sweep layers (router/service.py puts them together).

Each operation is one PostgreSQL transaction; Redis side effects (in-flight counters, wake-ups)
run after it commits (:class:`Effects`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from common import limits
from common.errors import FailedPrecondition
from common.fleet_clock import FleetClock
from common.keys import KeySet
from common.logs import get_logger
from common.protocol import features_floor
from router import ladder, store
from router.candidates import CandidateLoader
from router.key_chains import KeyChains
from router.live import CANDIDATES_CHANGED, InFlight, Liveness, TaskWakes, WakeHub
from router.sql import Row
from router.states import State
from router.submit import SubmitRequest
from router.trust_delivery import TrustDelivery

S = State
log = get_logger("versus.router")

# Bound on the report-key cache; past it the cache starts over (one PostgreSQL read per collector).
MAX_CACHED_REPORT_KEYS = 100_000

# How long a leased dispatch waits to be claimed; its envelope expires then too.
DISPATCH_TTL_S = 300
MAX_CLAIM_WAIT_S = 30.0
NO_ELIGIBLE = "no_eligible_collector"
# Eligible collectors exist, but none holds a dispatch key the router still has (docs/envelope.md).
NO_KEY_HELD = "no_collector_holds_a_live_dispatch_key"

Effect = Callable[[], Awaitable[object]]


class DeviceLeased(FailedPrecondition):
    default_code = "device_leased"


@dataclass
class Effects:
    """What an operation's transaction did besides its writes: Redis updates to run once it has
    committed, and the task rows as its transitions left them (the caller's answer, not read again)."""

    pending: list[Effect] = field(default_factory=list)
    rows: dict[str, Row] = field(default_factory=dict)

    def add(self, effect: Effect) -> None:
        self.pending.append(effect)

    def moved(self, row: Row | None) -> None:
        """Note a task row a transition returned."""
        if row is not None:
            self.rows[row["task_id"]] = row

    async def run(self) -> None:
        for effect in self.pending:
            try:
                await effect()
            except Exception:  # Redis is advisory: a lost update is repaired by the next rebuild
                log.warning("post-commit redis update failed", exc_info=True)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A dispatch handed to its collector."""

    dispatch_id: str
    envelope: bytes
    # Vault mode B: the signed document relaying its device credential (JSON), if any.
    credential: str | None = None


Offer = Mapping[str, Any]


# A signed document in its wire form (common/signed_doc.py).
SignedDoc = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    """What one claim hands the collector: dispatches, offers, a config to restart with, and
    verdicts on tasks it holds (dispatch id -> "continue", "cancel" or "terminate")."""

    claimed: tuple[Claimed, ...] = ()
    offers: tuple[Offer, ...] = ()
    restart: SignedDoc | None = None
    verdicts: Mapping[str, str] = field(default_factory=dict)
    # Credential revocations for tasks it runs (router/revocations.py ``revokes_for``).
    revokes: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ReportResult:
    duplicate: bool
    state: State


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _task_values(req: SubmitRequest, digest: bytes) -> dict[str, Any]:
    return {
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
        "state": S.QUEUED.value,
    }


# Queued tasks looked at per re-evaluation: a sweep or a collector coming back, and a freed slot.
REEVALUATE_BATCH = 100
FREED_SLOT_BATCH = 8


class RouterCore:
    """Connections, caches and background tasks every layer of the router shares."""

    def __init__(
        self,
        engine: AsyncEngine,
        redis: Redis,
        dispatch_keys: Callable[[], KeySet],
        *,
        max_attempts: int = ladder.DEFAULT_MAX_ATTEMPTS,
        dispatch_ttl_s: int = DISPATCH_TTL_S,
    ):
        self.engine = engine
        # Single statements that need no transaction (reads, the claim's take) run in autocommit:
        # no BEGIN and COMMIT round trips on the hot path.
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.redis = redis
        # Each envelope is signed with a key its collector holds (KeySet.signing_key_for).
        self.dispatch_keys = dispatch_keys
        # Collectors' public keys, to verify their reports (read from PostgreSQL on a miss).
        self._report_keys: dict[str, ec.EllipticCurvePublicKey] = {}
        self.max_attempts = max_attempts
        self.dispatch_ttl_s = dispatch_ttl_s
        # Streamed output bounds and retention (router/output.py); the server sets them from settings.
        self.output_task_limit = limits.OUTPUT_TASK_LIMIT_BYTES
        self.output_tenant_quota = limits.OUTPUT_TENANT_QUOTA_BYTES
        self.output_retention_s = float(limits.OUTPUT_RETENTION_S)
        # Vault mode B's store (router/credential_store.py); set by the server.
        self.credential_store: Any = None
        # Liveness times are written by one replica and read by another: one clock (PostgreSQL's).
        self.clock = FleetClock()
        self.liveness = Liveness(redis)
        self.in_flight = InFlight(redis, self._load_in_flight)
        self.wake = WakeHub(redis)
        self.candidates = CandidateLoader(redis, self.in_flight, self.liveness.window_s, self.clock.now)
        self.task_wakes = TaskWakes(engine, self.wake, store.CHANGED_TASKS)
        self._background: set[asyncio.Task[Any]] = set()
        # Set by the server when this process also serves tunnels (router/tunnels.py).
        self.tunnels: Any = None
        # Set by the server: the enrollment service, owner of collector status (router/enrollment_client.py).
        self.enrollment: Any = None
        # Set by the server: the key sets' rotation chains (router/key_chains.py).
        self.key_chains: KeyChains | None = None
        # Set by the server: newer trust bundles for collectors behind (router/trust_delivery.py).
        self.trust: TrustDelivery | None = None
        # Set by the server: releases and upgrade targets (router/releases.py, router/updates.py).
        self.releases: Any = None
        self.updates: Any = None
        # Per claim in progress: whether the collector has dispatches from earlier claims unreported
        # (read with its standing; router/handout.py).
        self._unanswered: dict[str, bool] = {}
        # The dispatch key version each collector was last recorded as holding (saves a write per claim).
        self._held_dispatch_version: dict[str, int] = {}
        # The numbered claim of each collector that arrived last in this process (router/handout.py
        # ``_claim_in_progress``): another one still held here was abandoned and takes no work.
        self._live_claim: dict[str, object] = {}

    async def _load_in_flight(self) -> Mapping[tuple[str, str], int]:
        async with self.engine.connect() as conn:
            return await store.all_in_flight(conn)

    def _in_background(self, start: Effect) -> Effect:
        """An effect that starts ``start`` without waiting for it (the caller's answer goes first)."""

        async def run() -> None:
            self._spawn(start())

        return run

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def candidates_changed(self) -> None:
        """Forget cached candidate rows in this process now and in every other router replica
        (each caches a site's rows for a second: router/candidates.py)."""
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
        """Start listening for wake-ups and for other replicas' cache invalidations."""
        self.wake.start()
        self._spawn(self.follow_candidate_changes())
        self._spawn(self.clock.run(self.engine))

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.wake.stop()

    async def aclose(self) -> None:
        """Stop background work and close the connections this router was given."""
        await self.close()
        await self.redis.aclose()
        if self.enrollment is not None:
            await self.enrollment.close()
        await self.engine.dispose()
