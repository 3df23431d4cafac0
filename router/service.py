"""The Task Router: submit, place, hand out, collect results, walk the ladder, sweep.

Each operation is one PostgreSQL transaction; Redis side effects (in-flight
counters, wake-ups) run after it commits. Placement runs synchronously on
submit, so a refusal (device leased, op_class mismatch) writes nothing, and
again for queued work whenever a collector comes back, publishes
capabilities or frees capacity, and on the sweeper's tick.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from redis.asyncio import Redis
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from common import report_signature
from common.envelope import fence
from common.envelope.canonical import OpClass
from common.envelope.sign import EnvelopeDraft, sign
from common.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from common.keys import KeyPurpose, KeySet
from common.limits import MAX_CLAIM_BATCH
from common.logs import get_logger
from common.report_signature import ReportSignatureError, ReportStatement
from router import collector_docs, fleet_state, ladder, placement, store
from router.candidates import CandidateLoader
from router.key_chains import KeyChains
from router.live import WORK, InFlight, Liveness, TaskWakes, WakeHub
from router.metrics import CLAIM_WAIT, DISPATCH_STATES, NO_ELIGIBLE_TOTAL, SUBMIT_TO_CLAIM
from router.placement import Candidate, OperationCap, PlacementRequest
from router.states import TERMINAL, State, cancellable, check_transition
from router.submit import SubmitRequest, fingerprint, validate
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
    """Redis updates to run once the transaction has committed."""

    pending: list[Effect] = field(default_factory=list)

    def add(self, effect: Effect) -> None:
        self.pending.append(effect)

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


Offer = Mapping[str, Any]


# A signed document in its wire form (common/signed_doc.py).
SignedDoc = Mapping[str, str]


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
        "state": S.QUEUED.value,
    }


# Queued tasks looked at per re-evaluation: a sweep or a collector coming back, and a freed slot.
REEVALUATE_BATCH = 100
FREED_SLOT_BATCH = 8


class Router:
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
        self.liveness = Liveness(redis)
        self.in_flight = InFlight(redis, self._load_in_flight)
        self.wake = WakeHub(redis)
        self.candidates = CandidateLoader(redis, self.in_flight, self.liveness.window_s)
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
        # The dispatch key version each collector was last recorded as holding (saves a write per claim).
        self._held_dispatch_version: dict[str, int] = {}

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

    # --- submit and placement --------------------------------------------------------------------
    async def submit(self, req: SubmitRequest) -> tuple[RowMapping, bool]:
        """Create (or find, by idempotency key) a task and try to place it at once."""
        now = _now()
        validate(req, now)
        digest = fingerprint(req)
        effects = Effects()
        async with self.engine.begin() as conn:
            created = await store.insert_task(conn, _task_values(req, digest))
            # None: the key exists (a retry, or another submitter a moment ago).
            existing = (
                await store.task_by_key(conn, req.tenant_id, req.idempotency_key) if created is None else None
            )
            if existing is not None:
                if existing["request_sha256"] != digest:
                    raise Conflict(
                        f"idempotency_key {req.idempotency_key!r} was used for a different request",
                        code="idempotency_key_reused",
                    )
                return existing, True
            assert created is not None
            await store.transition(conn, created["task_id"], S.QUEUED, S.QUEUED, "submitted")
            await self._place(conn, created, effects, refuse=True)
            task = await store.get_task(conn, created["task_id"])
        await effects.run()
        assert task is not None
        return task, False

    async def _place(
        self, conn: AsyncConnection, task: RowMapping, effects: Effects, *, refuse: bool
    ) -> State:
        """Run the placement pipeline for a locked queued task.

        With ``refuse`` (at submit) a lease conflict or class mismatch raises, so
        nothing is written; later re-placements fail the task with that code instead.
        """
        if task["deadline"] <= _now():
            await store.release_lease(conn, task["target_ref"], task["task_id"])
            await store.transition(conn, task["task_id"], S.QUEUED, S.EXPIRED, "deadline passed while queued")
            return S.EXPIRED
        req = _placement_request(task)
        candidates = await self._candidates(conn, req)
        try:
            eligible = placement.eligible(req, candidates)
        except placement.OpClassMismatch as exc:
            if refuse:
                raise
            await store.transition(conn, task["task_id"], S.QUEUED, S.FAILED, exc.code, error_code=exc.code)
            return S.FAILED
        if task["attempts"]:
            # A collector that refused an envelope of this task as not valid for it is not asked again.
            refused = await store.refused_by(conn, task["task_id"])
            eligible = [c for c in eligible if c.collector_id not in refused]
        condition = NO_ELIGIBLE
        if eligible:
            # Only a collector that holds one of the set's live keys can verify what we sign.
            keys, now_s = self.dispatch_keys(), int(time.time())
            keyed = [c for c in eligible if keys.signing_key_for(c.dispatch_kids, now_s) is not None]
            condition = NO_ELIGIBLE if keyed else NO_KEY_HELD
            eligible = keyed
        # Try collectors in pick order; the authoritative capacity check is in PostgreSQL under the
        # collector's lock. Only the first lock may wait (store.lock_collector says why).
        locked_one = False
        while eligible:
            chosen = placement.pick(req, eligible)
            assert chosen is not None
            eligible.remove(chosen)
            if not await store.lock_collector(conn, chosen.collector_id, skip_locked=locked_one):
                continue
            locked_one = True
            cap = chosen.providers[req.provider].max_concurrency
            if await store.in_flight(conn, chosen.collector_id, req.provider) >= cap:
                continue
            return await self._lease_and_sign(
                conn, task, chosen, placement.operation_cap(chosen, req), effects, refuse
            )
        NO_ELIGIBLE_TOTAL.inc()
        if placement.needs_lease(task["op_class"], _declared_parallel_safe(candidates, req)):
            # A mutation holds its device from the moment it is accepted, queued or not, so a
            # second mutation of the same device is refused now rather than queued behind it.
            acquired = await store.acquire_lease(
                conn, task["target_ref"], task["task_id"], None, fence.fence_after(task["deadline"])
            )
            if isinstance(acquired, store.LeaseHeld):
                refusal = _lease_refusal(task["target_ref"], acquired)
                if refuse:
                    raise refusal
                await store.transition(
                    conn, task["task_id"], S.QUEUED, S.FAILED, refusal.message, error_code=refusal.code
                )
                return S.FAILED
        if task["condition"] != condition:
            await store.transition(conn, task["task_id"], S.QUEUED, S.QUEUED, condition, condition=condition)
        return S.QUEUED

    async def _lease_and_sign(
        self,
        conn: AsyncConnection,
        task: RowMapping,
        chosen: Candidate,
        op: OperationCap,
        effects: Effects,
        refuse: bool,
        *,
        kind: str = "execute",
        from_state: State = S.QUEUED,
    ) -> State:
        task_id = task["task_id"]
        epoch = 0
        if kind == "reconcile":
            holder = await store.lease_holder(conn, task["target_ref"])
            epoch = int(holder["epoch"]) if holder and holder["holder_task_id"] == task_id else 0
        elif placement.needs_lease(task["op_class"], op.parallel_safe):
            # The lease outlives the task's last possible envelope by the fence.
            acquired = await store.acquire_lease(
                conn, task["target_ref"], task_id, chosen.collector_id, fence.fence_after(task["deadline"])
            )
            if isinstance(acquired, store.LeaseHeld):
                refusal = _lease_refusal(task["target_ref"], acquired)
                if refuse:
                    raise refusal
                await store.transition(
                    conn, task_id, S.QUEUED, S.FAILED, refusal.message, error_code=refusal.code
                )
                return S.FAILED
            epoch = acquired
        now = _now()
        dispatch_id = f"dsp-{secrets.token_hex(10)}"
        if kind == "execute" and task["op_class"] != OpClass.READ:
            # A mutation's envelope fences its device if its holder goes silent: keep it short.
            expires = fence.mutation_expiry(now, task["deadline"], op.timeout_s, self.dispatch_ttl_s)
        else:
            expires = min(task["deadline"], now + dt.timedelta(seconds=self.dispatch_ttl_s))
        operation = op.reconcile_operation if kind == "reconcile" else task["operation"]
        op_class = OpClass.READ.value if kind == "reconcile" else task["op_class"]
        key = self.dispatch_keys().signing_key_for(chosen.dispatch_kids, int(now.timestamp()))
        assert key is not None, "placement keeps collectors that hold no live key out"
        envelope = sign(
            EnvelopeDraft(
                task_id=dispatch_id,
                collector_id=chosen.collector_id,
                provider=task["provider"],
                operation=operation,
                op_class=op_class,
                target_ref=task["target_ref"],
                idempotency_key=task["idempotency_key"],
                params=task["params"],
                not_before=int(now.timestamp()),
                expires_at=int(expires.timestamp()),
                lease_epoch=epoch,
            ),
            key,
        )
        attempt = task["attempts"] + (1 if kind == "execute" else 0)
        await store.insert_dispatch(
            conn,
            {
                "dispatch_id": dispatch_id,
                "task_id": task_id,
                "kind": kind,
                "attempt": attempt,
                "collector_id": chosen.collector_id,
                "site_id": task["site_id"],
                "target_ref": task["target_ref"],
                "provider": task["provider"],
                "operation": operation,
                "op_class": op_class,
                "state": S.LEASED.value,
                "lease_epoch": epoch,
                "envelope": envelope,
                "expires_at": expires,
            },
        )
        if epoch and kind == "execute":
            await store.set_lease_dispatch(conn, task["target_ref"], task_id, dispatch_id)
        DISPATCH_STATES.labels(S.LEASED.value).inc()
        if kind == "execute":
            await store.transitions(
                conn,
                task_id,
                [
                    (from_state, S.ROUTED, f"collector {chosen.collector_id}"),
                    (S.ROUTED, S.LEASED, f"lease epoch {epoch}" if epoch else "no lease needed"),
                ],
                dispatch_id,
                attempts=attempt,
                current_dispatch_id=dispatch_id,
                condition=None,
            )
        else:
            await store.transition(
                conn,
                task_id,
                S.RECONCILING,
                S.RECONCILING,
                "reconcile-read dispatched",
                dispatch_id,
                current_dispatch_id=dispatch_id,
            )
        provider, collector = task["provider"], chosen.collector_id
        effects.add(lambda: self.in_flight.add(collector, provider, 1))
        effects.add(lambda: self.wake.publish(collector, WORK))
        return S.LEASED

    async def _candidates(self, conn: AsyncConnection, req: PlacementRequest) -> list[Candidate]:
        """Collectors of the request's site and tenant with their liveness, load and drain state."""
        return await self.candidates.load(conn, req.site_id, req.tenant_id, req.provider)

    async def pick_tunnel_collector(
        self, collector_id: str, site_id: str, tenant_id: str, may_see: Callable[[str], bool] = lambda _: True
    ) -> str:
        """The live, active collector that will carry a tunnel: the one named, or one of the site's.

        A named collector must belong to the site and tenant the request names (when it names
        them) and to a tenant the caller may see (``may_see``): a tunnel never crosses into
        another tenant's network.
        """
        now = time.time()
        if collector_id:
            async with self.engine.connect() as conn:
                home = await store.collector_home(conn, collector_id)
            if home is None:
                raise NotFound(f"collector {collector_id!r} does not exist", code="collector_not_found")
            if (
                (tenant_id and home["tenant_id"] != tenant_id)
                or (site_id and home["site_id"] != site_id)
                or not may_see(home["tenant_id"])
            ):
                raise PermissionDenied(
                    f"collector {collector_id!r} does not serve that site and tenant",
                    code="collector_not_in_tenant",
                )
            if not await self.liveness.live([collector_id], now):
                raise FailedPrecondition(
                    f"collector {collector_id!r} is not connected", code="collector_not_live"
                )
            return collector_id
        if not site_id or not tenant_id:
            raise InvalidArgument("name a collector, or a site and tenant", code="tunnel_target_invalid")
        async with self.engine.connect() as conn:
            owner = await store.site_tenant(conn, site_id)
            rows = await store.candidates(conn, site_id, tenant_id)
        if owner is None or owner != tenant_id:
            # The same answer for "no such site" and "another tenant's site".
            raise NotFound(f"tenant {tenant_id!r} has no site {site_id!r}", code="site_not_found")
        live = sorted(await self.liveness.live([r["collector_id"] for r in rows], now))
        draining = await self.liveness.self_draining(live)
        usable = [cid for cid in live if cid not in draining]
        if not usable:
            raise FailedPrecondition(
                f"no live collector serves site {site_id!r}", code="no_eligible_collector"
            )
        return usable[0]

    async def fill_slot(self, site_id: str, tenant_id: str, provider: str) -> bool:
        """Place the oldest queued task of the site, tenant and provider after a slot was freed.

        Scanning the site's queue on every report made a backlog cost O(queue) per report (and
        most of the router's CPU); one indexed, SKIP LOCKED pick does the job. When that task
        cannot be placed (it needs a FIPS collector, say) a short general pass follows; the
        sweeper's pass covers the rest.
        """
        effects = Effects()
        async with self.engine.begin() as conn:
            task = await store.next_queued(conn, site_id, tenant_id, provider)
            if task is None:
                return False
            state = await self._place(conn, task, effects, refuse=False)
        await effects.run()
        if state != S.LEASED:
            return await self.reevaluate(site_id, FREED_SLOT_BATCH) > 0
        return True

    def _reevaluate_effect(self, site_id: str, limit: int = REEVALUATE_BATCH) -> Effect:
        async def run() -> None:
            await self.reevaluate(site_id, limit)

        return run

    async def reevaluate(self, site_id: str | None = None, limit: int = REEVALUATE_BATCH) -> int:
        """Try to place queued tasks again (each locked so replicas do not double-place)."""
        placed = 0
        async with self.engine.connect() as conn:
            queued = await store.queued_task_ids(conn, limit, site_id)
        # Within one pass, a task just like one that found no collector would not find one either:
        # skip its placement (the expensive part) rather than repeat it for the whole backlog.
        blocked: set[tuple[Any, ...]] = set()
        # One task per transaction: each placement holds its locks only briefly.
        for task_id in queued:
            effects = Effects()
            async with self.engine.begin() as conn:
                task = await store.lock_if_queued(conn, task_id)
                if task is None:
                    continue  # another replica has it, or it moved on
                shape = (task["site_id"], task["tenant_id"], task["provider"], task["operation"],
                         task["op_class"], task["requires_fips"])  # fmt: skip
                if shape in blocked:
                    continue
                if await self._place(conn, task, effects, refuse=False) == S.LEASED:
                    placed += 1
                else:
                    blocked.add(shape)
            await effects.run()
        return placed

    # --- claim -------------------------------------------------------------------------------------
    async def claim(self, collector_id: str, **kwargs: Any) -> Claimed | None:
        """:meth:`claim_with_offers` for callers that take one dispatch at a time."""
        claimed, _, _ = await self.claim_with_offers(collector_id, **kwargs)
        return claimed[0] if claimed else None

    async def _check_standing(
        self, collector_id: str, session_id: str, config_version: int, *, check_session: bool = True
    ) -> SignedDoc | None:
        """Refuse a claim from a collector that is no longer active or from a superseded session;
        the signed config when PostgreSQL holds a newer one than the collector runs."""
        async with self.autocommit.connect() as conn:
            row = await store.collector_standing(conn, collector_id)
        status = fleet_state.collector_status(row["status"], row["cert_not_after"], _now()) if row else None
        if status is fleet_state.CollectorStatus.REVOKED:
            raise Unauthenticated("the collector identity is revoked", code="collector_revoked")
        if status is fleet_state.CollectorStatus.EXPIRED:
            raise Unauthenticated("the collector certificate has expired", code="certificate_expired")
        if row is None or status is not fleet_state.CollectorStatus.ACTIVE:
            raise PermissionDenied(f"collector is {status or 'unknown'}", code="collector_not_active")
        if check_session and session_id and await self.liveness.is_superseded(collector_id, session_id):
            raise _superseded()
        if row["config_version"] > config_version:
            now = int(time.time())
            payload = collector_docs.config_payload(collector_id, row, now)
            signed = collector_docs.sign_for(self.dispatch_keys(), row["dispatch_kids"], payload, now)
            if signed is None:
                log.warning("cannot sign a config the collector could verify", collector_id=collector_id)
            return signed
        return None

    async def _record_held_dispatch_keys(self, collector_id: str, version: int) -> None:
        """Record the dispatch kids of the version the collector says it holds, so its envelopes
        are signed with them (the claim is authenticated: it speaks only for itself)."""
        if self._held_dispatch_version.get(collector_id) == version or self.key_chains is None:
            return
        kids = self.key_chains.kids(KeyPurpose.DISPATCH, version)
        if kids is not None:
            async with self.autocommit.connect() as conn:
                changed = await store.set_dispatch_kids(conn, collector_id, kids)
            if changed:
                log.info("collector holds a new dispatch key set", collector_id=collector_id, version=version)
                self.candidates.invalidate()
                # Work that waited for a collector holding a live key may be placeable now.
                self._spawn(self._reevaluate_for(collector_id))
        self._held_dispatch_version[collector_id] = version

    async def _signed_offers(self, collector_id: str, offers: Sequence[Offer]) -> tuple[Offer, ...]:
        """Each offer with its signed document; offers that cannot be signed are dropped (logged)."""
        if not offers:
            return ()
        async with self.autocommit.connect() as conn:
            held = await store.collector_dispatch_kids(conn, collector_id)
        now, keys, out = int(time.time()), self.dispatch_keys(), []
        for offer in offers:
            signed = collector_docs.sign_for(
                keys, held, collector_docs.offer_payload(collector_id, offer, now), now
            )
            if signed is None:
                log.warning(
                    "cannot sign a tunnel offer the collector could verify", collector_id=collector_id
                )
                continue
            out.append({**offer, "signed": signed})
        return tuple(out)

    async def claim_with_offers(
        self,
        collector_id: str,
        *,
        claim_seq: int,
        held_task_ids: frozenset[str],
        wait_s: float,
        draining: bool = False,
        agent_version: str = "",
        session_id: str = "",
        transport: str = "",
        vault_mode: str = "",
        config_version: int = 0,
        key_versions: Mapping[str, int] | None = None,
        max_dispatches: int = 1,
        free_slots: Mapping[str, int] | None = None,
    ) -> tuple[tuple[Claimed, ...], tuple[Offer, ...], SignedDoc | None]:
        """Hand the collector its next leased dispatches (up to ``max_dispatches``, capped at
        :data:`MAX_CLAIM_BATCH`) and any offers, waiting up to ``wait_s`` for either.

        The claim is the collector's heartbeat: it refreshes liveness and the
        session details (drain state, agent version, session id, transport,
        running vault mode) in Redis. Capacity and drain ride the claim too: a
        draining collector is handed no new dispatches, and one that names its
        ``free_slots`` only dispatches of providers with a free slot, at most as
        many as it has free (an empty map: the collector did not say).

        It is refused for a collector that is not
        active and for a superseded session (docs/fleet.md); when PostgreSQL
        holds a newer config than ``config_version`` (the one the collector
        runs) it returns at once with the signed config, and no work. Offers
        come with their signed documents (router/collector_docs.py). When
        ``key_versions`` (the key set and trust bundle versions the collector
        holds) are behind the store's it returns at once with no work: the
        caller attaches the rotation steps (router/key_chains.py) or the
        bundle (router/trust_delivery.py).
        """
        started = time.monotonic()
        # The session is checked by the heartbeat below (same round trip as recording the claim).
        restart = await self._check_standing(collector_id, session_id, config_version, check_session=False)
        session = {
            "draining": "1" if draining else "0",
            "agent_version": agent_version,
            "claim_seq": str(claim_seq),
            "transport": transport,
            "vault_mode": vault_mode,
            # "dispatch=3,release=2": which key set versions the running process holds (keys status).
            "key_versions": ",".join(f"{k}={int(v)}" for k, v in sorted((key_versions or {}).items())),
        }
        adopted, came_back = await self.liveness.heartbeat(collector_id, session_id, time.time(), session)
        if adopted < 0:
            raise _superseded()
        if adopted == 1:
            # Wake a held claim of the session this one replaces, so it is refused now, not at timeout.
            await self.wake.publish(collector_id)
        if came_back:
            self._spawn(self._reevaluate_for(collector_id))
        if restart is not None:
            return (), (), restart
        if key_versions and self.key_chains is not None:
            await self._record_held_dispatch_keys(collector_id, int(key_versions.get("dispatch", 1) or 1))
            if self.key_chains.behind(key_versions):
                return (), (), None
        if key_versions and self.trust is not None and self.trust.behind(key_versions):
            return (), (), None
        await self._requeue_never_received(collector_id, claim_seq, held_task_ids)
        deadline = started + min(max(wait_s, 0.0), MAX_CLAIM_WAIT_S)
        limit = min(max(max_dispatches, 1), MAX_CLAIM_BATCH)
        providers: list[str] | None = None
        if free_slots:
            providers = sorted(p for p, n in free_slots.items() if n > 0)
            limit = min(limit, sum(n for n in free_slots.values() if n > 0))
        taking = not draining and providers != []
        with self.wake.listener(collector_id) as woken:
            first = True
            while True:
                if not first and woken.payloads != {WORK.decode()}:
                    # Woken by more than new work: a revoke, a newer session or a vault-mode change.
                    restart = await self._check_standing(collector_id, session_id, config_version)
                    if restart is not None:
                        return (), (), restart
                first = False
                woken.clear()
                taken = await self.tunnels.take_offers(collector_id) if self.tunnels else []
                offers = await self._signed_offers(collector_id, taken)
                got = await self._take(collector_id, claim_seq, limit, providers) if taking else ()
                if got or offers:
                    CLAIM_WAIT.observe(time.monotonic() - started)
                    return got, offers, None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    CLAIM_WAIT.observe(time.monotonic() - started)
                    return (), (), None
                try:
                    async with asyncio.timeout(remaining):
                        await woken.wait()
                except TimeoutError:
                    pass

    async def _reevaluate_for(self, collector_id: str) -> None:
        async with self.engine.connect() as conn:
            site_id = await store.collector_site(conn, collector_id)
        if site_id is not None:
            await self.reevaluate(site_id)

    async def _take(
        self, collector_id: str, claim_seq: int, limit: int, providers: Sequence[str] | None = None
    ) -> tuple[Claimed, ...]:
        async with self.autocommit.connect() as conn:
            rows = await store.take_leased(conn, collector_id, claim_seq, limit, providers)
        now = _now()
        for row in rows:
            DISPATCH_STATES.labels(S.DISPATCHED.value).inc()
            SUBMIT_TO_CLAIM.observe((now - row["created_at"]).total_seconds())
        return tuple(Claimed(row["dispatch_id"], bytes(row["envelope"])) for row in rows)

    async def _requeue_never_received(self, collector_id: str, claim_seq: int, held: frozenset[str]) -> None:
        if claim_seq <= 0:
            return
        async with self.autocommit.connect() as conn:
            if not await store.any_handed_out(conn, collector_id, claim_seq):
                return
        effects = Effects()
        async with self.engine.begin() as conn:
            for d in await store.handed_out(conn, collector_id, claim_seq):
                hand_out = ladder.HandOut(int(d["handed_claim_seq"] or 0), d["reported_at"] is not None)
                if not ladder.never_received(hand_out, claim_seq, held, d["dispatch_id"]):
                    continue
                task = await store.get_task(conn, d["task_id"], lock=True)
                assert task is not None
                await self._abandon(conn, d, effects, "expired")
                if d["kind"] == "execute" and task["state"] == S.DISPATCHED.value:
                    # The task keeps its device lease while it waits to be placed again.
                    await store.transition(
                        conn,
                        task["task_id"],
                        S.DISPATCHED,
                        S.QUEUED,
                        f"collector {collector_id} never received it (claim {claim_seq})",
                        d["dispatch_id"],
                    )
                    effects.add(self._reevaluate_effect(task["site_id"]))
                elif d["kind"] == "reconcile" and task["state"] == S.RECONCILING.value:
                    # The reconcile-read was lost on the way: ask again with a new dispatch.
                    await self._dispatch_reconcile(conn, task["task_id"], effects)
        await effects.run()

    async def _abandon(self, conn: AsyncConnection, d: RowMapping, effects: Effects, state: str) -> None:
        """Retire a dispatch that will never run; it no longer counts against its collector."""
        await store.update_dispatch(conn, d["dispatch_id"], state=state)
        DISPATCH_STATES.labels(state).inc()
        collector, provider = d["collector_id"], d["provider"]
        effects.add(lambda: self.in_flight.add(collector, provider, -1))

    # --- report ------------------------------------------------------------------------------------
    async def report(
        self,
        collector_id: str,
        dispatch_id: str,
        outcome: State,
        result: bytes = b"",
        error_code: str = "",
        error_message: str = "",
        *,
        refused: bool = False,
        signature: str | None = None,
    ) -> ReportResult:
        """Record a collector's report on a dispatch it was given; see docs/router.md for the rules.

        ``refused``: the collector refused the envelope with ``error_code`` and did not run it
        (:func:`router.ladder.on_refusal` says what that means for the task).
        ``signature``: the collector's signature over the report (common/report_signature.py),
        checked against its key in PostgreSQL before anything is recorded, then kept with the
        dispatch. Every report from a collector carries one (the bridge passes ``""`` when it is
        missing, which is refused); ``None`` is for callers inside the router's own process.
        """
        statement = ReportStatement(
            collector_id,
            dispatch_id,
            "refused" if refused else outcome.value,
            result,
            error_code,
            error_message,
        )
        if refused:
            outcome = S.FAILED
        effects = Effects()
        async with self.engine.begin() as conn:
            found = await store.get_dispatch(conn, dispatch_id)
            if found is not None and found["collector_id"] == collector_id and signature is not None:
                try:
                    await self._check_report_signature(conn, statement, signature)
                except ReportSignatureError as exc:
                    await store.audit(
                        conn, collector_id, "report.bad_signature", str(found["task_id"]),
                        {"dispatch_id": dispatch_id, "code": exc.code},
                    )  # fmt: skip
                    log.warning("report signature refused", collector_id=collector_id, code=exc.code)
                    refusal: ReportSignatureError | None = exc
                else:
                    refusal = None
            else:
                refusal = None
            if found is not None and found["collector_id"] != collector_id:
                # Speaking about another collector's work is recorded: it may be an attack.
                await store.audit(
                    conn,
                    collector_id,
                    "report.foreign_dispatch",
                    str(found["task_id"]),
                    {"dispatch_id": dispatch_id},
                )
                log.warning("report for another collector's dispatch", collector_id=collector_id)
        if found is None or found["collector_id"] != collector_id:
            # The same answer for "unknown" and "someone else's": a collector learns nothing about others.
            raise PermissionDenied(
                f"dispatch {dispatch_id!r} was not dispatched to you", code="not_your_dispatch"
            )
        if refusal is not None:
            raise refusal
        async with self.engine.begin() as conn:
            task = await store.get_task(conn, found["task_id"], lock=True)
            d = await store.get_dispatch(conn, dispatch_id, lock=True)
            assert task is not None and d is not None
            if signature is not None and d["state"] in (S.DISPATCHED, S.RUNNING):
                await store.update_dispatch(conn, dispatch_id, report_signature=signature)
            if d["reported_at"] is not None and d["state"] in (S.SUCCESS, S.FAILED, S.UNKNOWN):
                same = d["state"] == outcome.value and bytes(d["result"] or b"") == result
                if same:
                    return ReportResult(True, State(task["state"]))
                raise Conflict("a different terminal report was already recorded", code="conflicting_report")
            if d["state"] not in (S.DISPATCHED, S.RUNNING):
                raise FailedPrecondition(
                    f"dispatch is {d['state']}; no report expected", code="report_not_expected"
                )
            if refused:
                state = await self._refused(conn, task, d, error_code, error_message, effects)
            else:
                state = await self._apply_report(
                    conn, task, d, outcome, result, error_code, error_message, effects
                )
        await effects.run()
        return ReportResult(False, state)

    async def _check_report_signature(
        self, conn: AsyncConnection, statement: ReportStatement, signature: str
    ) -> None:
        """Verify with the collector's key (cached; read again from PostgreSQL when it refuses)."""
        cid = statement.collector_id
        cached = self._report_keys.get(cid)
        if cached is not None:
            try:
                report_signature.verify(signature, cached, statement)
                return
            except ReportSignatureError:
                pass  # the collector may have renewed with a new key: ask PostgreSQL
        der = await store.collector_public_key(conn, cid)
        if der is None:
            raise ReportSignatureError("no key on record for this collector")
        try:
            key = serialization.load_der_public_key(der)
        except ValueError:
            key = None
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise ReportSignatureError("the key on record for this collector cannot verify reports")
        report_signature.verify(signature, key, statement)
        if len(self._report_keys) >= MAX_CACHED_REPORT_KEYS:
            self._report_keys.clear()
        self._report_keys[cid] = key

    async def _apply_report(
        self,
        conn: AsyncConnection,
        task: RowMapping,
        d: RowMapping,
        outcome: State,
        result: bytes,
        error_code: str,
        error_message: str,
        effects: Effects,
    ) -> State:
        task_id, dispatch_id, current = task["task_id"], d["dispatch_id"], State(task["state"])
        if outcome == S.RUNNING:
            await store.update_dispatch(conn, dispatch_id, state=S.RUNNING.value)
            if d["kind"] == "execute" and current == S.DISPATCHED:
                await store.transition(
                    conn, task_id, S.DISPATCHED, S.RUNNING, "collector started it", dispatch_id
                )
                return S.RUNNING
            return current
        await self._answered(conn, task, d, outcome, result, error_code, error_message, effects)
        if d["kind"] == "reconcile":
            return await self._after_reconcile(conn, task, d, outcome, result, effects, error_code=error_code)
        if current not in (S.DISPATCHED, S.RUNNING):
            return current  # the task moved on (for instance cancelled or resolved); keep the report only
        if outcome in (S.SUCCESS, S.FAILED):
            check_transition(current, outcome)
            await store.release_lease(conn, task["target_ref"], task_id)
            await store.transition(
                conn,
                task_id,
                current,
                outcome,
                error_code or outcome.value,
                dispatch_id,
                result=result,
                error_code=error_code or None,
            )
            return outcome
        evidence = f"collector {d['collector_id']} reported unknown: {error_code} {error_message}".strip()
        await store.transition(
            conn, task_id, current, S.UNKNOWN, "collector reported unknown", dispatch_id, evidence=evidence
        )
        return await self._climb(conn, task, evidence, effects)

    async def _answered(
        self,
        conn: AsyncConnection,
        task: RowMapping,
        d: RowMapping,
        outcome: State,
        result: bytes,
        error_code: str,
        error_message: str,
        effects: Effects,
    ) -> None:
        """Record the collector's final answer on a dispatch; its slot is free again."""
        await store.update_dispatch(
            conn, d["dispatch_id"], state=outcome.value, reported_at=_now(), result=result,
            error_code=error_code or None, error_message=error_message[:1000] or None,
        )  # fmt: skip
        DISPATCH_STATES.labels(outcome.value).inc()
        collector, provider = d["collector_id"], d["provider"]
        effects.add(lambda: self.in_flight.add(collector, provider, -1))
        # One slot of this provider was freed: give it the oldest queued task that could use it.
        site_id, tenant_id = task["site_id"], task["tenant_id"]
        effects.add(self._in_background(lambda: self.fill_slot(site_id, tenant_id, provider)))

    async def _refused(
        self,
        conn: AsyncConnection,
        task: RowMapping,
        d: RowMapping,
        code: str,
        message: str,
        effects: Effects,
    ) -> State:
        """A collector refused an envelope: it never ran it there."""
        current = State(task["state"])
        verdict = ladder.on_refusal(code)
        if verdict is ladder.Refusal.ALREADY_HELD:
            return current  # the collector holds this dispatch already; its real report follows
        dispatch_id, task_id, collector = d["dispatch_id"], task["task_id"], d["collector_id"]
        error_code = f"envelope_refused:{code}"
        await self._answered(conn, task, d, S.FAILED, b"", error_code, message, effects)
        if d["kind"] == "reconcile":
            return await self._after_reconcile(conn, task, d, S.FAILED, b"", effects, refused=True)
        if verdict is ladder.Refusal.REROUTE and current == S.DISPATCHED:
            # Never run, so safe anywhere else; placement skips every collector that refused it.
            await store.transition(
                conn, task_id, S.DISPATCHED, S.QUEUED,
                f"collector {collector} refused it ({code}); placing it elsewhere", dispatch_id,
            )  # fmt: skip
            effects.add(self._reevaluate_effect(task["site_id"]))
            return S.QUEUED
        if current not in (S.DISPATCHED, S.RUNNING):
            return current
        await store.release_lease(conn, task["target_ref"], task_id)
        await store.transition(
            conn, task_id, current, S.FAILED, error_code, dispatch_id, error_code=error_code,
        )  # fmt: skip
        return S.FAILED

    async def _climb(
        self,
        conn: AsyncConnection,
        task: RowMapping,
        evidence: str,
        effects: Effects,
        fenced_until: dt.datetime | None = None,
    ) -> State:
        """Walk the ladder for a task now in ``unknown``.

        ``fenced_until``: the lost envelope could still run on its silent holder until then,
        so a reconcile-read waits for it (the sweeper climbs again once ``retry_at`` passes).
        """
        fresh = await store.get_task(conn, task["task_id"])
        assert fresh is not None
        step = ladder.on_unknown(fresh["op_class"], fresh["attempts"], self.max_attempts)
        task_id = fresh["task_id"]
        if step == ladder.Step.RECONCILE and fresh["deadline"] <= _now():
            return await self._indeterminate(
                conn, fresh, S.UNKNOWN, f"{evidence}; deadline passed before reconciling"
            )
        if step == ladder.Step.RETRY:
            await store.release_lease(conn, fresh["target_ref"], task_id)
            await store.transition(
                conn, task_id, S.UNKNOWN, S.QUEUED, "read retried with a new dispatch", retry_at=None
            )
            effects.add(self._reevaluate_effect(fresh["site_id"]))
            return S.QUEUED
        if step == ladder.Step.RECONCILE:
            if fenced_until is not None and fenced_until > _now():
                await store.transition(
                    conn,
                    task_id,
                    S.UNKNOWN,
                    S.UNKNOWN,
                    f"reconcile-read waits for the lost envelope's fence (until {fenced_until:%H:%M:%S})",
                    retry_at=fenced_until,
                )
                return S.UNKNOWN
            await store.transition(
                conn, task_id, S.UNKNOWN, S.RECONCILING, "reconcile-read before any retry", retry_at=None
            )
            return await self._dispatch_reconcile(conn, task_id, effects)
        return await self._indeterminate(conn, fresh, S.UNKNOWN, evidence)

    async def _indeterminate(
        self, conn: AsyncConnection, task: RowMapping, current: State, evidence: str
    ) -> State:
        await store.release_lease(conn, task["target_ref"], task["task_id"])
        await store.transition(
            conn, task["task_id"], current, S.INDETERMINATE, "waiting for an operator", evidence=evidence
        )
        log.warning("task indeterminate", task_id=task["task_id"], target_ref=task["target_ref"])
        return S.INDETERMINATE

    async def _dispatch_reconcile(self, conn: AsyncConnection, task_id: str, effects: Effects) -> State:
        task = await store.get_task(conn, task_id)
        assert task is not None
        req = _placement_request(task)
        cands = [c for c in await self._candidates(conn, req) if c.live and not c.draining]
        usable = [c for c in cands if (op := _op(c, req)) is not None and op.reconcile_operation]
        chosen = placement.pick(req, usable)
        while chosen is not None and not await store.lock_collector(
            conn, chosen.collector_id, skip_locked=False
        ):
            usable.remove(chosen)  # revoked, expired or drained since the candidate list was read
            chosen = placement.pick(req, usable)
        if chosen is None:
            return await self._indeterminate(
                conn, task, S.RECONCILING, "no collector can run the reconcile-read"
            )
        await self._lease_and_sign(
            conn, task, chosen, placement.operation_cap(chosen, req), effects, False, kind="reconcile"
        )
        return S.RECONCILING

    async def _after_reconcile(
        self,
        conn: AsyncConnection,
        task: RowMapping,
        d: RowMapping,
        outcome: State,
        result: bytes,
        effects: Effects,
        refused: bool = False,
        error_code: str = "",
    ) -> State:
        if task["state"] != S.RECONCILING:
            return State(task["state"])
        # The read answers "not applied" by failing without an error code; failing with one means
        # the read itself went wrong, which says nothing about the device.
        applied: bool | None = None
        if not refused and outcome == S.SUCCESS:
            applied = True
        elif not refused and outcome == S.FAILED and not error_code:
            applied = False
        task_id = task["task_id"]
        if applied is None:
            why = "reconcile-read refused" if refused else "reconcile-read was inconclusive"
            return await self._reconcile_again(conn, task, why, d, effects)
        step = ladder.after_reconcile(applied, task["attempts"], self.max_attempts)
        if step is None:
            await store.release_lease(conn, task["target_ref"], task_id)
            await store.transition(
                conn,
                task_id,
                S.RECONCILING,
                S.SUCCESS,
                "reconcile-read confirmed the change",
                d["dispatch_id"],
                result=result,
                evidence="reconciled: applied",
            )
            return S.SUCCESS
        if step == ladder.Step.RETRY:
            await store.transition(
                conn,
                task_id,
                S.RECONCILING,
                S.QUEUED,
                "reconcile-read: not applied; retrying",
                d["dispatch_id"],
            )
            fresh = await store.get_task(conn, task_id)
            assert fresh is not None
            # The device lease is kept across the retry: the same task re-acquires it with a new epoch.
            return await self._place(conn, fresh, effects, refuse=False)
        # Known not to have landed, and no attempts left: that is a failure, not an unknown.
        await store.release_lease(conn, task["target_ref"], task_id)
        await store.transition(
            conn, task_id, S.RECONCILING, S.FAILED,
            f"reconcile-read: not applied after {task['attempts']} attempts", d["dispatch_id"],
            error_code="not_applied", evidence="reconciled: not applied",
        )  # fmt: skip
        return S.FAILED

    async def _reconcile_again(
        self, conn: AsyncConnection, task: RowMapping, why: str, d: RowMapping, effects: Effects
    ) -> State:
        """The reconcile-read gave no answer (lost, refused, inconclusive): ask again, within bounds."""
        task_id = task["task_id"]
        reconciles = await store.reconcile_count(conn, task_id)
        step = ladder.after_reconcile(None, task["attempts"], self.max_attempts, reconciles)
        if step == ladder.Step.RECONCILE and task["deadline"] > _now():
            await store.transition(
                conn, task_id, S.RECONCILING, S.RECONCILING, f"{why}; asking again", d["dispatch_id"]
            )
            return await self._dispatch_reconcile(conn, task_id, effects)
        return await self._indeterminate(conn, task, S.RECONCILING, f"{why} (reconcile-reads: {reconciles})")

    # --- cancel, resolve, read -----------------------------------------------------------------------
    async def cancel(self, task_id: str, reason: str) -> RowMapping:
        effects = Effects()
        async with self.engine.begin() as conn:
            task = await store.get_task(conn, task_id, lock=True)
            if task is None:
                raise NotFound(f"task {task_id!r} does not exist", code="task_not_found")
            current = State(task["state"])
            if current == S.CANCELLED:
                return task
            if not cancellable(current):
                raise FailedPrecondition(
                    f"a {current.value} task cannot be cancelled: it is with a collector or finished",
                    code="not_cancellable",
                )
            if task["current_dispatch_id"] and current == S.LEASED:
                d = await store.get_dispatch(conn, task["current_dispatch_id"], lock=True)
                if d is not None and d["state"] == S.LEASED:
                    await self._abandon(conn, d, effects, S.CANCELLED.value)
            await store.release_lease(conn, task["target_ref"], task_id)
            await store.transition(conn, task_id, current, S.CANCELLED, reason or "cancelled by caller")
            cancelled = await store.get_task(conn, task_id)
        await effects.run()
        assert cancelled is not None
        return cancelled

    async def resolve(self, task_id: str, outcome: State, note: str, actor: str) -> RowMapping:
        if outcome not in (S.SUCCESS, S.FAILED):
            raise FailedPrecondition("resolution must be success or failed", code="resolution_invalid")
        async with self.engine.begin() as conn:
            task = await store.get_task(conn, task_id, lock=True)
            if task is None:
                raise NotFound(f"task {task_id!r} does not exist", code="task_not_found")
            if task["state"] != S.INDETERMINATE:
                raise FailedPrecondition(
                    f"task is {task['state']}, not indeterminate", code="not_indeterminate"
                )
            await store.transition(
                conn, task_id, S.INDETERMINATE, outcome, f"resolved by {actor}: {note}", resolved_by=actor
            )
            await store.audit(conn, actor, f"task.resolve.{outcome.value}", task_id, {"note": note})
            resolved = await store.get_task(conn, task_id)
        assert resolved is not None
        return resolved

    async def get(self, task_id: str) -> tuple[RowMapping, Sequence[RowMapping]]:
        async with self.engine.connect() as conn:
            task = await store.get_task(conn, task_id)
            if task is None:
                raise NotFound(f"task {task_id!r} does not exist", code="task_not_found")
            return task, await store.history(conn, task_id)

    # --- capabilities ------------------------------------------------------------------------------
    async def publish_capabilities(
        self, collector_id: str, epoch: int, manifest: Mapping[str, Any], fips: bool, version: str
    ) -> int:
        async with self.engine.begin() as conn:
            stored = await store.upsert_capabilities(conn, collector_id, epoch, manifest, fips, version)
        if stored == epoch:
            self.candidates.invalidate()
            self._spawn(self._reevaluate_for(collector_id))
        return stored

    # --- sweeper ---------------------------------------------------------------------------------------
    async def _unclaimed(
        self, conn: AsyncConnection, d: RowMapping, task: RowMapping, effects: Effects, why: str
    ) -> None:
        """Retire a leased dispatch that was never handed out and put its task back in the queue."""
        await self._abandon(conn, d, effects, S.EXPIRED.value)
        if d["kind"] == "execute" and task["state"] == S.LEASED.value:
            # Never handed out, so never executed: safe to place again (the lease is kept).
            await store.transition(conn, task["task_id"], S.LEASED, S.QUEUED, why, d["dispatch_id"])
        elif d["kind"] == "reconcile" and task["state"] == S.RECONCILING.value:
            await self._indeterminate(conn, task, S.RECONCILING, f"reconcile-read {why}")

    async def collector_removed(self, collector_id: str) -> int:
        """After a revoke: re-place the work leased to the collector and stop counting it live.

        Work already handed out is left to the sweeper, which sees a silent holder
        and climbs the unknown-outcome ladder; a claim still held is woken and refused.
        """
        effects = Effects()
        moved = 0
        async with self.engine.begin() as conn:
            for d in await store.leased_to(conn, collector_id):
                task = await store.get_task(conn, d["task_id"], lock=True)
                if task is not None:
                    await self._unclaimed(conn, d, task, effects, f"collector {collector_id} revoked")
                    effects.add(self._reevaluate_effect(task["site_id"]))
                    moved += 1
        await self.liveness.forget(collector_id)
        await self.wake.publish(collector_id)
        await effects.run()
        return moved

    async def sweep(self, batch: int = 200) -> dict[str, int]:
        """One pass: unclaimed leases, silent holders, blown deadlines, orphan device leases."""
        counts = {"unclaimed": 0, "unknown": 0, "expired": 0, "leases": 0}
        effects = Effects()
        now_s = time.time()
        async with self.engine.begin() as conn:
            for d in await store.expired_leased_dispatches(conn, batch):
                task = await store.get_task(conn, d["task_id"], lock=True, skip_locked=True)
                if task is None:
                    continue
                await self._unclaimed(conn, d, task, effects, "not claimed in time")
                counts["unclaimed"] += 1
            in_flight = await store.in_flight_dispatches(conn, batch)
            # Silent means known to be silent: after Redis lost its data, nobody is until a window passed.
            silent_ids = await self.liveness.silent({d["collector_id"] for d in in_flight}, now_s)
            for d in in_flight:
                silent = d["collector_id"] in silent_ids
                overdue = d["deadline"] <= _now()
                if not (silent or overdue):
                    continue
                task = await store.get_task(conn, d["task_id"], lock=True, skip_locked=True)
                if task is None:
                    continue
                why = "holder stopped claiming" if silent else "deadline passed while in flight"
                await self._abandon(conn, d, effects, S.UNKNOWN.value)
                counts["unknown"] += 1
                current = State(task["state"])
                if d["kind"] == "reconcile":
                    if current == S.RECONCILING:
                        await self._reconcile_again(conn, task, f"reconcile-read lost: {why}", d, effects)
                    continue
                if current in (S.DISPATCHED, S.RUNNING):
                    await store.transition(
                        conn, task["task_id"], current, S.UNKNOWN, why, d["dispatch_id"], evidence=why
                    )
                    # Its envelope may still run on the silent holder until its fence.
                    fenced = fence.fence_after(d["expires_at"]) if d["op_class"] != OpClass.READ else None
                    await self._climb(conn, task, why, effects, fenced)
            for task in await store.unknown_due(conn, batch):
                await self._climb(conn, task, task["evidence"] or "outcome unknown", effects)
                counts["unknown"] += 1
            for task_id in await store.overdue_queued(conn, batch):
                await store.transition(conn, task_id, S.QUEUED, S.EXPIRED, "deadline passed while queued")
                counts["expired"] += 1
            counts["leases"] = await store.orphan_leases(conn)
        await effects.run()
        # Counter updates race with a rebuild after a Redis flush (a change committed before the
        # rebuild may be applied again after it); re-syncing from PostgreSQL each pass bounds the drift.
        await self.in_flight.rebuild()
        return counts


def _lease_refusal(target_ref: str, held: store.LeaseHeld) -> DeviceLeased:
    if held.holder_task_id:
        return DeviceLeased(
            f"device {target_ref!r} is leased by task {held.holder_task_id}",
            details={"holder_task_id": held.holder_task_id},
        )
    until = held.fenced_until.isoformat() if held.fenced_until else ""
    return DeviceLeased(
        f"device {target_ref!r} is fenced until {until}: an envelope of its previous writer was never "
        "answered and could still run until then",
        details={"fenced_until": until},
    )


def _superseded() -> Conflict:
    return Conflict(
        "a newer session of this collector replaced this one; stop this process", code="session_superseded"
    )


def _placement_request(task: RowMapping) -> PlacementRequest:
    return PlacementRequest(
        provider=task["provider"],
        operation=task["operation"],
        op_class=task["op_class"],
        site_id=task["site_id"],
        tenant_id=task["tenant_id"],
        target_ref=task["target_ref"],
        requires_fips=task["requires_fips"],
    )


def _declared_parallel_safe(candidates: Sequence[Candidate], req: PlacementRequest) -> bool:
    """Whether the drivers that advertise the operation declare it parallel-safe (no driver: not)."""
    declared = [op for c in candidates if (op := _op(c, req)) is not None]
    return bool(declared) and all(op.parallel_safe for op in declared)


def _op(candidate: Candidate, req: PlacementRequest) -> OperationCap | None:
    provider = candidate.providers.get(req.provider)
    return provider.operations.get(req.operation) if provider else None


__all__ = ["TERMINAL", "Claimed", "DeviceLeased", "ReportResult", "Router", "SubmitRequest"]
