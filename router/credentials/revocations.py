"""Taking a credential back from running tasks (protocol 5, docs/protocol.md "Credential revocation").

A credential is named ``<provider>:<target_ref>``: the credential the collector's
driver for that provider uses for that device (in vault mode A, its entry in the
collector's ``credentials.json``). Revoking it:

1. finds the running dispatches of that device (dispatched or running, not yet
   answered) and groups them by collector: the **targets**;
2. records the revocation and each target in PostgreSQL (audited), a target
   ``pending`` when its collector is live, ``unreachable`` when it is away, and
   ``failed`` when it took the work under a protocol older than 5 (it could never
   be asked);
3. notes it for each collector in Redis and wakes its held claim, whose answer
   carries the revoke; a resume claim gets every revoke its collector has not
   answered, from PostgreSQL;
4. takes the collector's ack (what it actually scrubbed, per dispatch): the target
   becomes ``revoked``, or ``failed`` when the collector says it could not.

The sweeper marks a pending target ``unreachable`` once :data:`REVOKE_ACK_S` pass
without an answer, and notes every unanswered target again each pass, so a
collector that comes back gets it (a Redis loss costs nothing either).
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from common import protocol
from common.access import rbac
from common.errors import InvalidArgument, NotFound
from common.redis.keys import REVOKE
from router.core import store
from router.core.base import RouterCore
from router.credentials import revocation_store

# A pending target not answered for this long is shown unreachable (and keeps being noted).
REVOKE_ACK_S = 10
ACTIONS = ("scrub", "kill")
MAX_REF_CHARS = 256
# What a collector may say about one dispatch.
RESULTS = ("scrubbed", "not_held", "killed")
# A target in one of these states still waits for its collector's answer; in any other it has one.
UNANSWERED = ("pending", "unreachable")


def parse_ref(ref: str) -> tuple[str, str]:
    """``<provider>:<target_ref>`` as its parts (``credential_ref_invalid`` otherwise). Pure."""
    provider, sep, target = ref.partition(":")
    if not (sep and provider and target and len(ref) <= MAX_REF_CHARS and ref.isprintable()):
        raise InvalidArgument(
            "a credential is named <provider>:<target_ref>, e.g. ssh:core-sw-1", code="credential_ref_invalid"
        )
    return provider, target


def target_state(results: Mapping[str, str]) -> tuple[str, str]:
    """A target's state and detail from its collector's answer. Pure."""
    failed = sorted(d for d, r in results.items() if r not in RESULTS)
    if failed:
        return "failed", "; ".join(f"{d}: {results[d]}" for d in failed)[:1000]
    return "revoked", ""


def overall(states: Iterable[str]) -> str:
    """A revocation's state from its targets' (no target: revoked, nothing held it). Pure."""
    seen = set(states)
    for state in ("failed", "unreachable", "pending"):
        if state in seen:
            return state
    return "revoked"


class Revocations(RouterCore):
    """Revoke, deliver, acknowledge and follow credential revocations."""

    async def revoke_credential(self, ref: str, action: str, reason: str, actor: str) -> dict[str, Any]:
        provider, target_ref = parse_ref(ref)
        if action not in ACTIONS:
            raise InvalidArgument("action must be scrub or kill", code="revoke_action_invalid")
        revocation_id = f"rev-{secrets.token_hex(8)}"
        floor = protocol.floor_of("credential_revoke")
        async with self.engine.begin() as conn:
            # A platform token reaches only its tenants' tasks (docs/access.md).
            holders = await revocation_store.holders(conn, provider, target_ref, rbac.tenant_filter())
            silent = await self.liveness.silent({h["collector_id"] for h in holders}, self.clock.now())
            await revocation_store.create(conn, revocation_id, ref, action, reason[:500], actor)
            for h in holders:
                cid, handed = h["collector_id"], int(h["protocol"] or 1)
                if handed < floor:
                    state = "failed"
                    detail = (
                        f"took the work under protocol {handed}; revoking needs protocol {floor} or later"
                    )
                else:
                    state, detail = ("unreachable" if cid in silent else "pending"), ""
                await revocation_store.add_target(conn, revocation_id, cid, h["dispatch_ids"], state, detail)
            await store.audit(
                conn, actor, "credential.revoke", ref,
                {"revocation_id": revocation_id, "action": action, "reason": reason[:500],
                 "collectors": sorted(h["collector_id"] for h in holders)},
            )  # fmt: skip
            answer = await revocation_store.get(conn, revocation_id)
        assert answer is not None
        for target in answer["targets"]:
            if target["state"] in ("pending", "unreachable"):
                await self._tell_revoke(target["collector_id"], revocation_id)
        return answer

    async def _tell_revoke(self, collector_id: str, revocation_id: str) -> None:
        await self.liveness.note_revoke(collector_id, revocation_id)
        await self.wake.publish(collector_id, REVOKE)

    async def get_revocation(self, revocation_id: str) -> dict[str, Any]:
        async with self.autocommit.connect() as conn:
            found = await revocation_store.get(conn, revocation_id)
        if found is None:
            raise NotFound(f"revocation {revocation_id!r} does not exist", code="revocation_not_found")
        return found

    async def list_revocations(self, ref: str, limit: int) -> Sequence[dict[str, Any]]:
        async with self.autocommit.connect() as conn:
            return await revocation_store.latest(conn, ref, limit)

    async def revokes_for(
        self, collector_id: str, noted: Collection[str], resume: bool
    ) -> tuple[dict[str, Any], ...]:
        """What a claim of the collector carries: the revocations noted for it, and on a resume
        claim every one it has not answered (each with the dispatch ids it may hold)."""
        if not noted and not resume:
            return ()
        async with self.autocommit.connect() as conn:
            rows = await revocation_store.unanswered_for(conn, collector_id, list(noted), resume)
        return tuple(rows)

    async def ack_revocation(self, collector_id: str, revocation_id: str, results: Mapping[str, str]) -> bool:
        """Record what the collector scrubbed; False when the revocation is not addressed to it."""
        state, detail = target_state(results)
        async with self.engine.begin() as conn:
            target = await revocation_store.lock_target(conn, revocation_id, collector_id)
            if target is None:
                return False
            if target["state"] not in UNANSWERED:
                # The first answer stands: a revocation is carried until its ack is recorded, so a
                # collector may answer twice, and after a kill the second finds the task gone.
                return True
            known = set(target["dispatch_ids"])
            kept = {d: r[:200] for d, r in results.items() if d in known}
            await revocation_store.answer(conn, revocation_id, collector_id, state, kept, detail)
            await store.audit(
                conn, collector_id, "credential.revoke_ack", revocation_id, {"state": state, "results": kept}
            )
        return True

    async def sweep_revocations(self) -> int:
        """Pending targets not answered in time become unreachable; every unanswered target is
        noted again for its collector. The number noted."""
        async with self.engine.begin() as conn:
            await revocation_store.mark_unreachable(conn, dt.timedelta(seconds=REVOKE_ACK_S))
            waiting = await revocation_store.unanswered(conn)
        for row in waiting:
            await self._tell_revoke(row["collector_id"], row["revocation_id"])
        return len(waiting)
