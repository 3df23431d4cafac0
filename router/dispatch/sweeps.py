"""Capabilities, collectors leaving, and the sweeper: expired leases, silent holders, stale work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from common.envelope import fence
from common.envelope.canonical import OpClass
from common.telemetry.logs import get_logger
from router.core import store
from router.core.base import Effects, _now
from router.core.sql import Row
from router.core.states import State
from router.credentials.revocations import Revocations
from router.dispatch import sql_collectors, sql_dispatches, sql_leases, sql_tasks
from router.dispatch.cancels import Cancels
from router.output.streams import Outputs

S = State
log = get_logger("versus.router")


class Sweeps(Cancels, Outputs, Revocations):
    """Capabilities, collector removal and the sweeper."""

    async def publish_capabilities(
        self, collector_id: str, epoch: int, manifest: Mapping[str, Any], fips: bool, version: str
    ) -> int:
        async with self.engine.begin() as conn:
            stored = await sql_collectors.upsert_capabilities(
                conn, collector_id, epoch, manifest, fips, version
            )
        if stored == epoch:
            self.candidates_changed()
            self._spawn(self._reevaluate_for(collector_id))
        return stored

    async def _unclaimed(self, conn: AsyncConnection, d: Row, task: Row, effects: Effects, why: str) -> None:
        """Retire a leased dispatch that was never handed out and put its task back in the queue."""
        await self._abandon(conn, d, effects, S.EXPIRED.value)
        if d["kind"] == "execute" and task["state"] == S.LEASED.value:
            # Never handed out, so never executed: safe to place again (the lease is kept).
            await sql_tasks.transition(conn, task["task_id"], S.LEASED, S.QUEUED, why, d["dispatch_id"])
        elif d["kind"] == "reconcile" and task["state"] == S.RECONCILING.value:
            await self._indeterminate(conn, task, S.RECONCILING, f"reconcile-read {why}")

    async def collector_removed(self, collector_id: str) -> int:
        """After a revoke: re-place the work leased to the collector and stop counting it live.

        Work already handed out is left to the sweeper, which sees a silent holder
        and climbs the unknown-outcome ladder; a claim still held is woken and refused.
        """
        await self.liveness.forget(collector_id)
        moved = await self._requeue_leased(collector_id, f"collector {collector_id} revoked")
        await self.wake.publish(collector_id)
        return moved

    async def collector_said_goodbye(
        self, collector_id: str, session_id: str, reason: str
    ) -> tuple[int, bool]:
        """A collector's session is shutting down cleanly (docs/protocol.md, bye).

        It is offline from now until it claims again: placement passes it over, work leased to
        it and not yet handed out goes back to the queue at once, and the sweeper treats it as
        silent, so work it was handed and never answered climbs the ladder on the next pass
        instead of after the liveness window. Returns (requeued, whether the session was the
        current one; a superseded session's goodbye changes nothing).
        """
        if not await self.liveness.goodbye(collector_id, session_id, reason, self.clock.now()):
            return 0, False
        log.info("collector said goodbye", collector_id=collector_id, reason=reason)
        moved = await self._requeue_leased(collector_id, f"collector {collector_id} said goodbye")
        await self.wake.publish(collector_id)  # a claim of it still held here ends now
        return moved, True

    async def collector_vault_mode_changed(self, collector_id: str) -> int:
        """Work leased to the collector under its old vault mode and not handed out yet is placed
        again, so it never runs under the new mode (its envelope, and in mode B its relayed
        credential, were made for the old one). Work already handed out finishes in the old
        process, which drains before it restarts into the new mode."""
        return await self._requeue_leased(collector_id, f"collector {collector_id} changed vault mode")

    async def _requeue_leased(self, collector_id: str, why: str) -> int:
        """Retire the dispatches leased to the collector and not handed out; their tasks are queued."""
        effects = Effects()
        moved = 0
        async with self.engine.begin() as conn:
            for d in await sql_dispatches.leased_to(conn, collector_id):
                task = await store.get_task(conn, d["task_id"], lock=True)
                if task is not None:
                    await self._unclaimed(conn, d, task, effects, why)
                    effects.add(self._reevaluate_effect(task["site_id"]))
                    moved += 1
        await effects.run()
        return moved

    async def sweep(self, batch: int = 200) -> dict[str, int]:
        """One pass: unclaimed leases, silent holders, blown deadlines, orphan device leases, and
        cancels not answered for a while (noted for their collectors again)."""
        counts = {"unclaimed": 0, "unknown": 0, "expired": 0, "leases": 0}
        await self.in_flight.check_server()
        effects = Effects()
        now_s = self.clock.now()
        async with self.engine.begin() as conn:
            for d in await sql_dispatches.expired_leased_dispatches(conn, batch):
                task = await store.get_task(conn, d["task_id"], lock=True, skip_locked=True)
                if task is None:
                    continue
                await self._unclaimed(conn, d, task, effects, "not claimed in time")
                counts["unclaimed"] += 1
            in_flight = await sql_dispatches.in_flight_dispatches(conn, batch)
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
                    await sql_tasks.transition(
                        conn, task["task_id"], current, S.UNKNOWN, why, d["dispatch_id"], evidence=why
                    )
                    # Its envelope may still run on the silent holder until its fence.
                    fenced = fence.fence_after(d["expires_at"]) if d["op_class"] != OpClass.READ else None
                    await self._climb(conn, task, why, effects, fenced)
            for due in await sql_tasks.unknown_due(conn, batch):
                await self._climb(conn, due, due["evidence"] or "outcome unknown", effects)
                counts["unknown"] += 1
            for task_id in await sql_tasks.overdue_queued(conn, batch):
                await sql_tasks.transition(conn, task_id, S.QUEUED, S.EXPIRED, "deadline passed while queued")
                counts["expired"] += 1
            counts["leases"] = await sql_leases.orphan_leases(conn)
        await effects.run()
        # Counter updates race with a rebuild after a Redis flush (a change committed before the
        # rebuild may be applied again after it); re-syncing from PostgreSQL each pass bounds the drift.
        await self.in_flight.rebuild()
        counts["cancels"] = await self.renotify_cancels()
        counts["outputs_purged"] = await self.purge_outputs()
        counts["revokes_noted"] = await self.sweep_revocations()
        return counts
