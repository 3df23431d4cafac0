"""The unknown-outcome ladder with I/O: retry, reconcile-read, indeterminate (the rules are the pure
:mod:`router.dispatch.ladder`), and retiring dispatches that will never run."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.ext.asyncio import AsyncConnection

from common.telemetry import tracing
from common.telemetry.logs import get_logger
from router.core import store
from router.core.base import Effects, _now
from router.core.metrics import DISPATCH_STATES, LADDER_STEPS
from router.core.sql import Row
from router.core.states import State
from router.dispatch import ladder, placement, sql_collectors, sql_dispatches, sql_leases, sql_tasks
from router.dispatch.dispatching import operation_of, placement_request
from router.dispatch.requeue import Requeue

S = State
log = get_logger("versus.router")


class Outcomes(Requeue):
    """What happens to a dispatch whose outcome is unknown, refused or abandoned."""

    async def _abandon(self, conn: AsyncConnection, d: Row, effects: Effects, state: str) -> None:
        """Retire a dispatch that will never run; it no longer counts against its collector."""
        await sql_dispatches.update_dispatch(conn, d["dispatch_id"], state=state)
        DISPATCH_STATES.labels(state).inc()
        collector, provider = d["collector_id"], d["provider"]
        effects.add(lambda: self.in_flight.add(collector, provider, -1))

    async def _climb(
        self,
        conn: AsyncConnection,
        task: Row,
        evidence: str,
        effects: Effects,
        fenced_until: dt.datetime | None = None,
    ) -> State:
        """Walk the ladder for a task now in ``unknown``.

        ``fenced_until``: the lost envelope could still run on its silent holder until then,
        so a reconcile-read waits for it (the sweeper climbs again once ``retry_at`` passes).
        """
        attributes = {"versus.task_id": task["task_id"], "versus.evidence": evidence[:200]}
        with tracing.span(
            "versus.ladder.step", parent=task.get("traceparent"), attributes=attributes
        ) as span:
            state = await self._climbed(conn, task, evidence, effects, fenced_until, span)
            span.set("versus.state", state.value)
            return state

    async def _climbed(
        self, conn: AsyncConnection, task: Row, evidence: str, effects: Effects,
        fenced_until: dt.datetime | None, span: tracing.SpanHandle,
    ) -> State:  # fmt: skip
        fresh = await store.get_task(conn, task["task_id"])
        assert fresh is not None
        step = ladder.on_unknown(fresh["op_class"], fresh["attempts"], self.max_attempts)
        span.set("versus.ladder.step", step.value)
        LADDER_STEPS.labels(step.value).inc()
        task_id = fresh["task_id"]
        if step == ladder.Step.RECONCILE and fresh["deadline"] <= _now():
            return await self._indeterminate(
                conn, fresh, S.UNKNOWN, f"{evidence}; deadline passed before reconciling"
            )
        if step == ladder.Step.RETRY:
            if await self._cancelled_instead(conn, fresh, S.UNKNOWN, "a read is not retried"):
                return S.CANCELLED
            await sql_leases.release_lease(conn, fresh["target_ref"], task_id)
            await sql_tasks.transition(
                conn, task_id, S.UNKNOWN, S.QUEUED, "read retried with a new dispatch", retry_at=None
            )
            effects.add(self._reevaluate_effect(fresh["site_id"]))
            return S.QUEUED
        if step == ladder.Step.RECONCILE:
            if fenced_until is not None and fenced_until > _now():
                await sql_tasks.transition(
                    conn,
                    task_id,
                    S.UNKNOWN,
                    S.UNKNOWN,
                    f"reconcile-read waits for the lost envelope's fence (until {fenced_until:%H:%M:%S})",
                    retry_at=fenced_until,
                )
                return S.UNKNOWN
            await sql_tasks.transition(
                conn, task_id, S.UNKNOWN, S.RECONCILING, "reconcile-read before any retry", retry_at=None
            )
            return await self._dispatch_reconcile(conn, task_id, effects)
        return await self._indeterminate(conn, fresh, S.UNKNOWN, evidence)

    async def _cancelled_instead(
        self, conn: AsyncConnection, task: Row, current: State, why: str, dispatch_id: str | None = None
    ) -> bool:
        """Where the ladder would try again, a task whose cancel was asked for ends ``cancelled``
        instead (router/dispatch/cancels.py); whether it did."""
        if task["cancel_requested_at"] is None:
            return False
        await sql_leases.release_lease(conn, task["target_ref"], task["task_id"])
        await sql_tasks.transition(
            conn, task["task_id"], current, S.CANCELLED, f"cancel requested; {why}", dispatch_id
        )
        return True

    async def _indeterminate(self, conn: AsyncConnection, task: Row, current: State, evidence: str) -> State:
        await sql_leases.release_lease(conn, task["target_ref"], task["task_id"])
        await sql_tasks.transition(
            conn, task["task_id"], current, S.INDETERMINATE, "waiting for an operator", evidence=evidence
        )
        log.warning("task indeterminate", task_id=task["task_id"], target_ref=task["target_ref"])
        return S.INDETERMINATE

    async def _dispatch_reconcile(self, conn: AsyncConnection, task_id: str, effects: Effects) -> State:
        task = await store.get_task(conn, task_id)
        assert task is not None
        with tracing.span(
            "versus.task.reconcile", parent=task["traceparent"], attributes={"versus.task_id": task_id}
        ) as span:
            state = await self._reconcile_dispatched(conn, task, effects)
            span.set("versus.state", state.value)
            return state

    async def _reconcile_dispatched(self, conn: AsyncConnection, task: Row, effects: Effects) -> State:
        req = placement_request(task)
        cands = [c for c in await self._candidates(conn, req) if c.live and not c.draining]
        usable = [c for c in cands if (op := operation_of(c, req)) is not None and op.reconcile_operation]
        chosen = placement.pick(req, usable)
        while chosen is not None and not await sql_collectors.lock_collector(
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
        task: Row,
        d: Row,
        outcome: State,
        result: bytes,
        effects: Effects,
        refused: bool = False,
        error_code: str = "",
    ) -> State:
        if task["state"] != S.RECONCILING:
            return State(task["state"])
        attributes = {"versus.task_id": task["task_id"], "versus.dispatch_id": d["dispatch_id"],
                      "versus.reported": "refused" if refused else outcome.value}  # fmt: skip
        with tracing.span(
            "versus.reconcile.answer", parent=task["traceparent"], attributes=attributes
        ) as span:
            state = await self._reconcile_answered(
                conn, task, d, outcome, result, effects, refused, error_code
            )
            span.set("versus.state", state.value)
            return state

    async def _reconcile_answered(
        self, conn: AsyncConnection, task: Row, d: Row, outcome: State, result: bytes, effects: Effects,
        refused: bool, error_code: str,
    ) -> State:  # fmt: skip
        # The read answers "not applied" by failing without an error code; failing with one means
        # the read itself went wrong, which says nothing about the device.
        applied: bool | None = None
        if not refused and outcome == S.SUCCESS:
            applied = True
        elif not refused and outcome == S.FAILED and not error_code:
            applied = False
        task_id = task["task_id"]
        LADDER_STEPS.labels({True: "applied", False: "not_applied", None: "inconclusive"}[applied]).inc()
        if applied is None:
            why = "reconcile-read refused" if refused else "reconcile-read was inconclusive"
            return await self._reconcile_again(conn, task, why, d, effects)
        step = ladder.after_reconcile(applied, task["attempts"], self.max_attempts)
        if step is None:
            await sql_leases.release_lease(conn, task["target_ref"], task_id)
            await sql_tasks.transition(
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
            if await self._cancelled_instead(
                conn, task, S.RECONCILING, "reconcile-read: not applied; not retried", d["dispatch_id"]
            ):
                return S.CANCELLED
            await sql_tasks.transition(
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
        await sql_leases.release_lease(conn, task["target_ref"], task_id)
        await sql_tasks.transition(
            conn, task_id, S.RECONCILING, S.FAILED,
            f"reconcile-read: not applied after {task['attempts']} attempts", d["dispatch_id"],
            error_code="not_applied", evidence="reconciled: not applied",
        )  # fmt: skip
        return S.FAILED

    async def _reconcile_again(
        self, conn: AsyncConnection, task: Row, why: str, d: Row, effects: Effects
    ) -> State:
        """The reconcile-read gave no answer (lost, refused, inconclusive): ask again, within bounds."""
        task_id = task["task_id"]
        reconciles = await sql_tasks.reconcile_count(conn, task_id)
        step = ladder.after_reconcile(None, task["attempts"], self.max_attempts, reconciles)
        if step == ladder.Step.RECONCILE and task["deadline"] > _now():
            await sql_tasks.transition(
                conn, task_id, S.RECONCILING, S.RECONCILING, f"{why}; asking again", d["dispatch_id"]
            )
            return await self._dispatch_reconcile(conn, task_id, effects)
        return await self._indeterminate(conn, task, S.RECONCILING, f"{why} (reconcile-reads: {reconciles})")
