"""Submit and placement: a task is checked, stored and placed on one eligible collector with a lease
and a signed envelope in one transaction; queued work is placed again when capacity appears."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from collections.abc import Callable, Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy.ext.asyncio import AsyncConnection

from common.envelope import fence
from common.envelope.canonical import OpClass
from common.envelope.sign import EnvelopeDraft, sign
from common.errors import Conflict, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from common.redis.keys import WORK
from common.telemetry import tracing
from common.telemetry.logs import get_logger
from common.trust import signed_doc
from common.trust.credential_relay import seal_for
from common.trust.keys import SigningKey
from common.trust.signed_doc import RELAYED_CREDENTIAL
from router.core import store
from router.core.base import Effects, _now
from router.core.metrics import DISPATCH_STATES, LEASE_CONFLICTS, NO_ELIGIBLE_TOTAL
from router.core.sql import Row
from router.core.states import State
from router.credentials.vault import CredentialUnreadable
from router.dispatch import placement, sql_collectors, sql_leases, sql_tasks
from router.dispatch.core import (
    NO_ELIGIBLE,
    NO_KEY_HELD,
    DeviceLeased,
    DispatchCore,
    _task_values,
)
from router.dispatch.placement import Candidate, OperationCap, PlacementRequest
from router.dispatch.submit import Audited, SubmitRequest, fingerprint, validate

S = State
log = get_logger("versus.router")


class Dispatching(DispatchCore):
    """Submit and placement."""

    async def submit(self, req: SubmitRequest, audited: Audited | None = None) -> tuple[Row, bool]:
        """Create (or find, by idempotency key) a task and try to place it at once; ``audited``
        records an audit event about the new task in the same transaction (a retry by an operator)."""
        now = _now()
        validate(req, now)
        digest = fingerprint(req)
        with tracing.span("versus.task.submit", root=True, attributes=_submit_attributes(req)) as span:
            task, existing = await self._submit(req, digest, span.traceparent(), audited)
            span.set("versus.task_id", task["task_id"])
            span.set("versus.state", task["state"])
            if existing:
                span.set("versus.existing", True)
            return task, existing

    async def _submit(
        self, req: SubmitRequest, digest: bytes, traceparent: str, audited: Audited | None
    ) -> tuple[Row, bool]:
        effects = Effects()
        async with self.engine.begin() as conn:
            created = await sql_tasks.insert_task(conn, _task_values(req, digest, traceparent))
            # None: the key exists (a retry, or another submitter a moment ago).
            existing = (
                await sql_tasks.task_by_key(conn, req.tenant_id, req.idempotency_key)
                if created is None
                else None
            )
            if existing is not None:
                if existing["request_sha256"] != digest:
                    raise Conflict(
                        f"idempotency_key {req.idempotency_key!r} was used for a different request",
                        code="idempotency_key_reused",
                    )
                return existing, True
            assert created is not None  # its "submitted" history row was written with it
            if audited is not None:
                await store.audit(conn, audited.actor, audited.action, created["task_id"], audited.details)
            await self._place(conn, created, effects, refuse=True)
        await effects.run()
        # The row as placement left it (no transition: as it was created).
        return effects.rows.get(created["task_id"], created), False

    async def _place(self, conn: AsyncConnection, task: Row, effects: Effects, *, refuse: bool) -> State:
        """Run the placement pipeline for a locked queued task.

        With ``refuse`` (at submit) a lease conflict or class mismatch raises, so
        nothing is written; later re-placements fail the task with that code instead.
        """
        with tracing.span(
            "versus.task.place",
            parent=task.get("traceparent"),
            attributes={"versus.task_id": task["task_id"]},
        ) as span:
            state = await self._placed(conn, task, effects, refuse)
            span.set("versus.state", state.value)
            return state

    async def _placed(self, conn: AsyncConnection, task: Row, effects: Effects, refuse: bool) -> State:
        if task["deadline"] <= _now():
            await sql_leases.release_lease(conn, task["target_ref"], task["task_id"])
            effects.moved(
                await sql_tasks.transition(
                    conn, task["task_id"], S.QUEUED, S.EXPIRED, "deadline passed while queued"
                )
            )
            return S.EXPIRED
        req = placement_request(task)
        candidates = await self._candidates(conn, req)
        try:
            eligible = placement.eligible(req, candidates)
        except placement.OpClassMismatch as exc:
            if refuse:
                raise
            effects.moved(
                await sql_tasks.transition(
                    conn, task["task_id"], S.QUEUED, S.FAILED, exc.code, error_code=exc.code
                )
            )
            return S.FAILED
        if task["attempts"]:
            # A collector that refused an envelope of this task as not valid for it is not asked again.
            refused = await sql_tasks.refused_by(conn, task["task_id"])
            eligible = [c for c in eligible if c.collector_id not in refused]
        condition = placement.shortfall(req, candidates) or NO_ELIGIBLE
        if eligible:
            # Only a collector that holds one of the set's live keys can verify what we sign.
            keys, now_s = self.dispatch_keys(), int(time.time())
            keyed = [c for c in eligible if keys.signing_key_for(c.dispatch_kids, now_s) is not None]
            condition = NO_ELIGIBLE if keyed else NO_KEY_HELD
            eligible = keyed
        # Try collectors in pick order; the authoritative capacity check is in PostgreSQL under the
        # collector's lock. Only the first lock may wait (sql_collectors.lock_collector says why).
        locked_one = False
        while eligible:
            chosen = placement.pick(req, eligible)
            assert chosen is not None
            eligible.remove(chosen)
            # Other placements of this process see the slot taken from now (router/dispatch/reservations.py).
            release = self.candidates.reservations.hold(chosen.collector_id, req.provider)
            if not await sql_collectors.lock_collector(conn, chosen.collector_id, skip_locked=locked_one):
                release()
                continue
            locked_one = True
            cap = chosen.providers[req.provider].max_concurrency
            if await sql_collectors.in_flight(conn, chosen.collector_id, req.provider) >= cap:
                release()
                continue
            return await self._leased_on(conn, task, chosen, req, effects, refuse, release)
        NO_ELIGIBLE_TOTAL.inc()
        if placement.needs_lease(task["op_class"], _declared_parallel_safe(candidates, req)):
            # A mutation holds its device from the moment it is accepted, queued or not, so a
            # second mutation of the same device is refused now rather than queued behind it.
            acquired = await sql_leases.acquire_lease(
                conn, task["target_ref"], task["task_id"], None, fence.fence_after(task["deadline"])
            )
            if isinstance(acquired, sql_leases.LeaseHeld):
                refusal = _lease_refusal(task["target_ref"], acquired)
                LEASE_CONFLICTS.labels("submit" if refuse else "placement").inc()
                if refuse:
                    raise refusal
                effects.moved(
                    await sql_tasks.transition(
                        conn, task["task_id"], S.QUEUED, S.FAILED, refusal.message, error_code=refusal.code
                    )
                )
                return S.FAILED
        if task["condition"] != condition:
            effects.moved(
                await sql_tasks.transition(
                    conn, task["task_id"], S.QUEUED, S.QUEUED, condition, condition=condition
                )
            )
        return S.QUEUED

    async def _relayed_credential(
        self, conn: AsyncConnection, task: Row, chosen: Candidate, dispatch_id: str, key: SigningKey,
        expires_at: int,
    ) -> str | None:  # fmt: skip
        """Vault mode B: the task's device credential for ``chosen``, encrypted to its key and
        signed like the envelope (common/trust/credential_relay.py); None when the collector is not in
        mode B or nothing is stored for the device (its driver then fails ``no_credentials``)."""
        if not chosen.relayed or self.credential_store is None:
            return None
        ref = f"{task['provider']}:{task['target_ref']}"
        try:
            value = await self.credential_store.open(conn, task["tenant_id"], ref)
        except CredentialUnreadable as exc:
            log.error("stored credential unreadable; not relayed", credential_ref=ref, code=exc.code)
            return None
        der = await sql_collectors.collector_public_key(conn, chosen.collector_id)
        public = serialization.load_der_public_key(der) if der else None
        if value is None or not isinstance(public, ec.EllipticCurvePublicKey):
            return None
        payload = {
            "type": RELAYED_CREDENTIAL, "collector_id": chosen.collector_id, "issued_at": int(time.time()),
            "expires_at": expires_at, **seal_for(public, chosen.collector_id, dispatch_id, ref, value),
        }  # fmt: skip
        await store.audit(
            conn, "router", "credential.deliver", ref,
            {"tenant_id": task["tenant_id"], "collector_id": chosen.collector_id, "dispatch_id": dispatch_id},
        )  # fmt: skip
        return json.dumps(signed_doc.sign(key, payload), separators=(",", ":"))

    async def _lease_and_sign(
        self,
        conn: AsyncConnection,
        task: Row,
        chosen: Candidate,
        op: OperationCap,
        effects: Effects,
        refuse: bool,
        *,
        kind: str = "execute",
        from_state: State = S.QUEUED,
    ) -> State:
        attributes = {"versus.task_id": task["task_id"], "versus.collector_id": chosen.collector_id,
                      "versus.dispatch_kind": kind}  # fmt: skip
        with tracing.span(
            "versus.dispatch.lease", parent=task.get("traceparent"), attributes=attributes
        ) as span:
            return await self._leased_and_signed(
                conn, task, chosen, op, effects, refuse, kind, from_state, span
            )

    async def _leased_and_signed(
        self, conn: AsyncConnection, task: Row, chosen: Candidate, op: OperationCap, effects: Effects,
        refuse: bool, kind: str, from_state: State, span: tracing.SpanHandle,
    ) -> State:  # fmt: skip
        task_id = task["task_id"]
        epoch = 0
        if kind == "reconcile":
            holder = await sql_leases.lease_holder(conn, task["target_ref"])
            epoch = int(holder["epoch"]) if holder and holder["holder_task_id"] == task_id else 0
        elif placement.needs_lease(task["op_class"], op.parallel_safe):
            # The lease outlives the task's last possible envelope by the fence.
            acquired = await sql_leases.acquire_lease(
                conn, task["target_ref"], task_id, chosen.collector_id, fence.fence_after(task["deadline"])
            )
            if isinstance(acquired, sql_leases.LeaseHeld):
                refusal = _lease_refusal(task["target_ref"], acquired)
                LEASE_CONFLICTS.labels("submit" if refuse else "placement").inc()
                if refuse:
                    raise refusal
                effects.moved(
                    await sql_tasks.transition(
                        conn, task_id, S.QUEUED, S.FAILED, refusal.message, error_code=refusal.code
                    )
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
        relayed = await self._relayed_credential(
            conn, task, chosen, dispatch_id, key, int(expires.timestamp())
        )
        dispatch = {
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
            "relayed_credential": relayed,
            "traceparent": span.traceparent() or None,
        }
        span.set("versus.dispatch_id", dispatch_id)
        span.set("versus.lease_epoch", epoch)
        DISPATCH_STATES.labels(S.LEASED.value).inc()
        # The dispatch, the lease's note of it and the task's move: one statement.
        if kind == "execute":
            moved = await sql_tasks.transitions(
                conn,
                task_id,
                [
                    (from_state, S.ROUTED, f"collector {chosen.collector_id}"),
                    (S.ROUTED, S.LEASED, f"lease epoch {epoch}" if epoch else "no lease needed"),
                ],
                dispatch_id,
                new_dispatch=dispatch,
                attempts=attempt,
                current_dispatch_id=dispatch_id,
                condition=None,
            )
        else:
            moved = await sql_tasks.transitions(
                conn,
                task_id,
                [(S.RECONCILING, S.RECONCILING, "reconcile-read dispatched")],
                dispatch_id,
                new_dispatch=dispatch,
                current_dispatch_id=dispatch_id,
            )
        effects.moved(moved)
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
        now = self.clock.now()
        if collector_id:
            async with self.engine.connect() as conn:
                home = await sql_collectors.collector_home(conn, collector_id)
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
            owner = await sql_collectors.site_tenant(conn, site_id)
            rows = await sql_collectors.candidates(conn, site_id, tenant_id)
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

    async def _leased_on(
        self,
        conn: AsyncConnection,
        task: Row,
        chosen: Candidate,
        req: PlacementRequest,
        effects: Effects,
        refuse: bool,
        release: Callable[[], None],
    ) -> State:
        """Lease and sign on a locked collector with a free slot; the slot's hold ends once Redis
        counts the dispatch (or now, when the task could not be leased)."""
        try:
            state = await self._lease_and_sign(
                conn, task, chosen, placement.operation_cap(chosen, req), effects, refuse
            )
        except BaseException:
            release()
            raise
        if state is S.LEASED:

            async def released() -> None:
                release()

            effects.add(released)  # after the in-flight count went up (effects run in order)
        else:
            release()
        return state


def _lease_refusal(target_ref: str, held: sql_leases.LeaseHeld) -> DeviceLeased:
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


def _submit_attributes(req: SubmitRequest) -> dict[str, str]:
    """What a submit span says about the request (never its parameters: they may hold secrets)."""
    return {
        "versus.tenant_id": req.tenant_id, "versus.site_id": req.site_id,
        "versus.provider": req.provider, "versus.operation": req.operation,
        "versus.op_class": req.op_class, "versus.target_ref": req.target_ref,
    }  # fmt: skip


def placement_request(task: Row) -> PlacementRequest:
    return PlacementRequest(
        provider=task["provider"],
        operation=task["operation"],
        op_class=task["op_class"],
        site_id=task["site_id"],
        tenant_id=task["tenant_id"],
        target_ref=task["target_ref"],
        requires_fips=task["requires_fips"],
        features=tuple(task["features"]),
    )


def _declared_parallel_safe(candidates: Sequence[Candidate], req: PlacementRequest) -> bool:
    """Whether the drivers that advertise the operation declare it parallel-safe (no driver: not)."""
    declared = [op for c in candidates if (op := operation_of(c, req)) is not None]
    return bool(declared) and all(op.parallel_safe for op in declared)


def operation_of(candidate: Candidate, req: PlacementRequest) -> OperationCap | None:
    provider = candidate.providers.get(req.provider)
    return provider.operations.get(req.operation) if provider else None
