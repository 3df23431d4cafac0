"""Claims: the collector's heartbeat and the hand-out of leased dispatches, offers and signed
documents (config, key steps, trust bundles), with the session and standing checks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from common import protocol
from common.errors import Conflict, PermissionDenied, Unauthenticated
from common.limits import MAX_CLAIM_BATCH
from common.redis.fanout import Wake
from common.redis.keys import CANCEL_TEXT, REVOKE_TEXT, WORK_TEXT
from common.telemetry.logs import get_logger
from common.trust.keys import KeyPurpose
from router.core import fleet_state, store
from router.core.base import Effects, _now
from router.core.metrics import CLAIM_WAIT, DISPATCH_STATES, SUBMIT_TO_CLAIM
from router.core.states import State
from router.credentials import vault_secrets
from router.credentials.revocations import Revocations
from router.credentials.vault import CredentialUnreadable
from router.dispatch import ladder, sql_collectors, sql_dispatches, sql_tasks
from router.dispatch.cancels import Cancels
from router.dispatch.core import MAX_CLAIM_WAIT_S, ClaimAnswer, Claimed, Offer, SignedDoc
from router.trust import collector_docs

S = State
log = get_logger("versus.router")

# After a wake-up for work that finds none, the take is tried again after these pauses (seconds).
RETAKE_AFTER_S = (0.02, 0.1, 0.5, 2.0)
# Local wake-up payload: a newer claim of the collector arrived (older held claims end).
NEWER_CLAIM = "newer-claim"


class HandOut(Cancels, Revocations):
    """Claims and what they carry."""

    async def claim(self, collector_id: str, **kwargs: Any) -> Claimed | None:
        """:meth:`claim_with_offers` for callers that take one dispatch at a time."""
        claimed = (await self.claim_with_offers(collector_id, **kwargs)).claimed
        return claimed[0] if claimed else None

    async def _check_standing(
        self,
        collector_id: str,
        session_id: str,
        config_version: int,
        *,
        check_session: bool = True,
        claim_seq: int = 0,
    ) -> SignedDoc | None:
        """Refuse a claim from a collector that is no longer active or from a superseded session;
        the signed config when PostgreSQL holds a newer one than the collector runs.

        With ``claim_seq``, the same read also says whether any dispatch handed out in an earlier
        claim is still unreported (kept in ``_unanswered`` for :meth:`_requeue_never_received`)."""
        async with self.autocommit.connect() as conn:
            row = await sql_collectors.collector_standing(conn, collector_id, before_claim_seq=claim_seq)
        if claim_seq > 0 and row is not None:
            self._unanswered[collector_id] = bool(row["handed_out"])
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
            secret = await self._vault_secret(collector_id, row) if row["vault_mode"] == "external" else None
            payload = collector_docs.config_payload(collector_id, row, now, secret)
            signed = collector_docs.sign_for(self.dispatch_keys(), row["dispatch_kids"], payload, now)
            if signed is None:
                log.warning("cannot sign a config the collector could verify", collector_id=collector_id)
            return signed
        return None

    async def _vault_secret(self, collector_id: str, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """Vault mode C: the collector's AppRole secret id encrypted to its key
        (router/credentials/vault_secrets.py);
        None when there is none or it cannot be opened here (logged: the collector then says
        ``vault_secret_id_missing`` on every credentialed task until an operator sets one)."""
        if row["vault_secret"] is None or self.credential_store is None:
            log.error("no vault secret id to deliver in the config", collector_id=collector_id,
                      stored=row["vault_secret"] is not None)  # fmt: skip
            return None
        version = int(row["vault_secret_version"])
        try:
            value = vault_secrets.open_stored(
                self.credential_store.master, collector_id, version, row["vault_secret"]
            )
        except CredentialUnreadable as exc:
            log.error("stored vault secret id unreadable; config sent without it", collector_id=collector_id,
                      code=exc.code)  # fmt: skip
            return None
        async with self.autocommit.connect() as conn:
            der = await sql_collectors.collector_public_key(conn, collector_id)
        public = serialization.load_der_public_key(der) if der else None
        if not isinstance(public, ec.EllipticCurvePublicKey):
            return None
        return vault_secrets.for_collector(
            public, collector_id, version, str(row["secret_id_delivery"]), value
        )

    async def _record_held_dispatch_keys(self, collector_id: str, version: int) -> None:
        """Record the dispatch kids of the version the collector says it holds, so its envelopes
        are signed with them (the claim is authenticated: it speaks only for itself)."""
        if self._held_dispatch_version.get(collector_id) == version or self.key_chains is None:
            return
        kids = self.key_chains.kids(KeyPurpose.DISPATCH, version)
        if kids is not None:
            async with self.autocommit.connect() as conn:
                changed = await sql_collectors.set_dispatch_kids(conn, collector_id, kids)
            if changed:
                log.info("collector holds a new dispatch key set", collector_id=collector_id, version=version)
                self.candidates_changed()
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
        protocol_version: int = 1,
        resume: bool = False,
    ) -> ClaimAnswer:
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
        come with their signed documents (router/trust/collector_docs.py). When
        ``key_versions`` (the key set and trust bundle versions the collector
        holds) are behind the store's it returns at once with no work: the
        caller attaches the rotation steps (router/trust/key_chains.py) or the
        bundle (router/trust/delivery.py).

        With ``protocol_version`` 3 or later the answer carries verdicts on held tasks: cancels
        asked for since the last claim (it then returns without holding), and with ``resume`` a
        verdict on every task in ``held_task_ids`` (router/dispatch/cancels.py).
        """
        started = time.monotonic()
        # Subscribed before anything is looked at: work announced from here on wakes this claim,
        # and work announced just before is in the heartbeat (work_noted).
        async with self.wake.listening(collector_id) as woken:
            # The session is checked by the heartbeat below (same round trip as recording the claim).
            restart = await self._check_standing(
                collector_id, session_id, config_version, check_session=False, claim_seq=claim_seq
            )
            session = {
                "draining": "1" if draining else "0",
                "agent_version": agent_version,
                "claim_seq": str(claim_seq),
                "transport": transport,
                "vault_mode": vault_mode,
                # "dispatch=3,release=2": which key set versions the running process holds (keys status).
                "key_versions": ",".join(f"{k}={int(v)}" for k, v in sorted((key_versions or {}).items())),
                # The collector protocol version the gateway settled with it (docs/protocol.md).
                "protocol": str(protocol_version),
            }
            verdicts_spoken = protocol_version >= protocol.floor_of("cancel")
            revokes_spoken = protocol_version >= protocol.floor_of("credential_revoke")
            beat = await self.liveness.heartbeat(
                collector_id, session_id, self.clock.now(), session,
                take_cancels=verdicts_spoken, take_revokes=revokes_spoken,
            )  # fmt: skip
            if beat.adopted < 0:
                raise _superseded()
            if beat.adopted == 1:
                # Wake a held claim of the session this one replaces, so it is refused now, not at
                # timeout. (A first session replaces none: no wake-up, which would also send the
                # collector's next claim to a router instead of parking it in its gateway.)
                await self.wake.publish(collector_id)
            if beat.came_back or beat.adopted > 0:
                # Back, or a new process (perhaps a newer build reaching a feature's floor): queued
                # work it may now take is placed again.
                self._spawn(self._reevaluate_for(collector_id))
            verdicts = dict.fromkeys(beat.cancels, "cancel")
            if resume and verdicts_spoken:
                verdicts.update(await self.verdicts(collector_id, held_task_ids))
            revokes = await self.revokes_for(collector_id, beat.revokes, resume) if revokes_spoken else ()
            if restart is not None:
                return ClaimAnswer(restart=restart, verdicts=verdicts, revokes=revokes)
            if key_versions and self.key_chains is not None:
                await self._record_held_dispatch_keys(collector_id, int(key_versions.get("dispatch", 1) or 1))
                if self.key_chains.behind(key_versions):
                    return ClaimAnswer(verdicts=verdicts, revokes=revokes)
            if key_versions and self.trust is not None and self.trust.behind(key_versions):
                return ClaimAnswer(verdicts=verdicts, revokes=revokes)
            with self._claim_in_progress(collector_id, claim_seq) as still_live:
                return await self._hand_out(
                    collector_id, claim_seq, held_task_ids, started, wait_s, draining, session_id,
                    config_version, max_dispatches, free_slots, still_live, protocol_version,
                    verdicts, revokes, woken, beat.work_noted,
                )  # fmt: skip

    @contextlib.contextmanager
    def _claim_in_progress(self, collector_id: str, claim_seq: int) -> Iterator[Callable[[], bool]]:
        """Mark a numbered claim as the collector's live one while it runs; yields whether it still is.

        Collectors send numbered claims one at a time (router/dispatch/ladder.py ``never_received``), so
        when a newer one arrives, an older one still held here was abandoned (its collector hung
        up): it is woken and returns without work instead of handing out a dispatch nobody reads,
        which would wait for the collector's next claim to be found and placed again. Across
        router replicas an abandoned claim held by another process is covered by that ladder.
        """
        if claim_seq <= 0:
            yield lambda: True
            return
        token = object()
        previous = self._live_claim.get(collector_id)
        self._live_claim[collector_id] = token
        if previous is not None:
            self.wake.wake(collector_id, NEWER_CLAIM)
        try:
            yield lambda: self._live_claim.get(collector_id) is token
        finally:
            if self._live_claim.get(collector_id) is token:
                del self._live_claim[collector_id]

    async def _hand_out(
        self,
        collector_id: str,
        claim_seq: int,
        held_task_ids: frozenset[str],
        started: float,
        wait_s: float,
        draining: bool,
        session_id: str,
        config_version: int,
        max_dispatches: int,
        free_slots: Mapping[str, int] | None,
        still_live: Callable[[], bool],
        protocol_version: int,
        verdicts: dict[str, str],
        revokes: tuple[Mapping[str, Any], ...],
        woken: Wake,
        work_noted: bool,
    ) -> ClaimAnswer:
        await self._requeue_never_received(collector_id, claim_seq, held_task_ids)
        deadline = started + min(max(wait_s, 0.0), MAX_CLAIM_WAIT_S)
        limit = min(max(max_dispatches, 1), MAX_CLAIM_BATCH)
        providers: list[str] | None = None
        if free_slots:
            providers = sorted(p for p, n in free_slots.items() if n > 0)
            limit = min(limit, sum(n for n in free_slots.values() if n > 0))
        taking = not draining and providers != []
        # Work announced just before this claim (its wake-up found no listener) may be locked in
        # passing at the first take, like work a wake-up announces: look again shortly then too.
        announced = work_noted or self.wake.work_announced_since(collector_id, started - 1.0)
        retakes = list(RETAKE_AFTER_S) if announced else []
        while True:
            if not still_live():
                # A newer claim of the collector arrived: this one is abandoned (a cancel it
                # took is noted again, for the newer claim).
                for dispatch_id, said in verdicts.items():
                    if said == "cancel":
                        await self.liveness.note_cancel(collector_id, dispatch_id)
                for revoke in revokes:
                    await self.liveness.note_revoke(collector_id, revoke["revocation_id"])
                return ClaimAnswer()
            # The claim listens from its start, so a wake-up may have come while its standing was
            # read and its heartbeat recorded: even on the first pass it is looked at, not cleared.
            if woken.payloads - {WORK_TEXT, CANCEL_TEXT, REVOKE_TEXT}:
                # Woken by more than new work: a revoke, a newer session or a vault-mode change.
                restart = await self._check_standing(collector_id, session_id, config_version)
                if restart is not None:
                    return ClaimAnswer(restart=restart, verdicts=verdicts, revokes=revokes)
            if CANCEL_TEXT in woken.payloads and protocol_version >= protocol.floor_of("cancel"):
                verdicts.update(dict.fromkeys(await self.liveness.take_cancels(collector_id), "cancel"))
            if REVOKE_TEXT in woken.payloads and protocol_version >= protocol.floor_of("credential_revoke"):
                noted = await self.liveness.take_revokes(collector_id)
                revokes = (*revokes, *await self.revokes_for(collector_id, noted, False))
            if WORK_TEXT in woken.payloads:
                retakes = list(RETAKE_AFTER_S)
            woken.clear()
            taken = await self.tunnels.take_offers(collector_id) if self.tunnels else []
            offers = await self._signed_offers(collector_id, taken)
            got = (
                await self._take(collector_id, claim_seq, limit, providers, protocol_version)
                if taking
                else ()
            )
            remaining = deadline - time.monotonic()
            if got or offers or verdicts or revokes or remaining <= 0:
                CLAIM_WAIT.observe(time.monotonic() - started)
                return ClaimAnswer(got, offers, None, verdicts, revokes)
            # Woken for work and found none: the row may be locked in passing (a queue pass
            # that read the task as queued locks the version that is leased now, and holds it
            # until it commits; the take skips locked rows). Look again shortly, a few times.
            pause = min(retakes.pop(0), remaining) if retakes else remaining
            try:
                async with asyncio.timeout(pause):
                    await woken.wait()
            except TimeoutError:
                pass

    async def _take(
        self,
        collector_id: str,
        claim_seq: int,
        limit: int,
        providers: Sequence[str] | None = None,
        protocol_version: int = 1,
    ) -> tuple[Claimed, ...]:
        async with self.autocommit.connect() as conn:
            rows = await sql_dispatches.take_leased(
                conn, collector_id, claim_seq, limit, providers, protocol_version
            )
        if rows:
            self.wake.taken(collector_id)
        now = _now()
        for row in rows:
            DISPATCH_STATES.labels(S.DISPATCHED.value).inc()
            SUBMIT_TO_CLAIM.observe((now - row["created_at"]).total_seconds())
        return tuple(
            Claimed(
                row["dispatch_id"],
                bytes(row["envelope"]),
                row["relayed_credential"],
                row["traceparent"] or "",
            )
            for row in rows
        )

    async def _requeue_never_received(self, collector_id: str, claim_seq: int, held: frozenset[str]) -> None:
        # Read with the collector's standing at the start of this claim (one statement for both).
        if claim_seq <= 0 or not self._unanswered.pop(collector_id, True):
            return
        effects = Effects()
        async with self.engine.begin() as conn:
            for d in await sql_dispatches.handed_out(conn, collector_id, claim_seq):
                hand_out = ladder.HandOut(int(d["handed_claim_seq"] or 0), d["reported_at"] is not None)
                if not ladder.never_received(hand_out, claim_seq, held, d["dispatch_id"]):
                    continue
                task = await store.get_task(conn, d["task_id"], lock=True)
                assert task is not None
                await self._abandon(conn, d, effects, "expired")
                if d["kind"] == "execute" and task["state"] == S.DISPATCHED.value:
                    if await self._cancelled_instead(
                        conn, task, S.DISPATCHED, f"collector {collector_id} never received it",
                        d["dispatch_id"],
                    ):  # fmt: skip
                        continue
                    # The task keeps its device lease while it waits to be placed again.
                    await sql_tasks.transition(
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


def _superseded() -> Conflict:
    return Conflict(
        "a newer session of this collector replaced this one; stop this process", code="session_superseded"
    )
