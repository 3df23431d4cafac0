"""Queued work placed again when capacity appears: a freed slot, a collector coming back or
publishing capabilities, and the sweeper's tick (placement itself is router/dispatch/dispatching.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from router.core.base import Effect, Effects, _now
from router.core.sql import Row
from router.core.states import State
from router.dispatch import placement, sql_collectors, sql_tasks
from router.dispatch.core import (
    FREED_SLOT_BATCH,
    REEVALUATE_BATCH,
)
from router.dispatch.dispatching import Dispatching, placement_request

S = State


class Requeue(Dispatching):
    """Re-evaluation of queued tasks, batched, with the wake-ups it owes."""

    async def fill_slot(self, site_id: str, tenant_id: str, provider: str, freed: str = "") -> bool:
        """Place the oldest queued task of the site, tenant and provider after a slot was freed.

        Scanning the site's queue on every report made a backlog cost O(queue) per report (and
        most of the router's CPU); one indexed, SKIP LOCKED pick does the job. The slot is offered
        to that task on the collector that freed it (``freed``) first: every freed slot is filled
        by one placement, instead of several placements contesting the same least-loaded
        collector. When that collector cannot run the task (it needs a FIPS collector, say) the
        task is placed as usual and, if it still waits, a short general pass follows; the
        sweeper's pass covers the rest. When the slot was taken meanwhile (by a submit), nothing
        more is done: the task waits for the next freed slot.
        """
        effects = Effects()
        async with self.engine.begin() as conn:
            task = await sql_tasks.next_queued(conn, site_id, tenant_id, provider)
            if task is None:
                return False
            state = await self._offer_slot(conn, task, freed, effects) if freed else None
            if state is S.QUEUED:
                return False
            if state is None:
                state = await self._place(conn, task, effects, refuse=False)
        await effects.run()
        if state != S.LEASED:
            return await self.reevaluate(site_id, FREED_SLOT_BATCH) > 0
        return True

    async def _offer_slot(
        self, conn: AsyncConnection, task: Row, collector_id: str, effects: Effects
    ) -> State | None:
        """Place a locked queued task on the collector that just freed a slot.

        ``QUEUED``: the collector could run it but its slot is taken again (nothing written).
        None: the collector cannot run it (or the task's own checks apply): place it as usual.
        """
        if task["deadline"] <= _now():
            return None
        req = placement_request(task)
        chosen = await self.candidates.one(conn, req.site_id, req.tenant_id, req.provider, collector_id)
        if chosen is None:
            return None
        try:
            if not placement.eligible(req, [chosen]):
                # Eligible but for its load: the slot went to other work since it was freed.
                idle = replace(chosen, in_flight={})
                return S.QUEUED if placement.eligible(req, [idle]) else None
        except placement.OpClassMismatch:
            return None
        if self.dispatch_keys().signing_key_for(chosen.dispatch_kids, int(time.time())) is None:
            return None
        if task["attempts"] and collector_id in await sql_tasks.refused_by(conn, task["task_id"]):
            return None
        release = self.candidates.reservations.hold(collector_id, req.provider)
        if not await sql_collectors.lock_collector(conn, collector_id, skip_locked=False):
            release()
            return None
        cap = chosen.providers[req.provider].max_concurrency
        if await sql_collectors.in_flight(conn, collector_id, req.provider) >= cap:
            release()
            return S.QUEUED
        return await self._leased_on(conn, task, chosen, req, effects, False, release)

    def _reevaluate_effect(self, site_id: str, limit: int = REEVALUATE_BATCH) -> Effect:
        async def run() -> None:
            await self.reevaluate(site_id, limit)

        return run

    async def reevaluate(self, site_id: str | None = None, limit: int = REEVALUATE_BATCH) -> int:
        """Try to place queued tasks again (each locked so replicas do not double-place)."""
        placed = 0
        async with self.engine.connect() as conn:
            queued = await sql_tasks.queued_task_ids(conn, limit, site_id)
        # Within one pass, a task just like one that found no collector would not find one either:
        # skip its placement (the expensive part) rather than repeat it for the whole backlog.
        blocked: set[tuple[Any, ...]] = set()
        # One task per transaction: each placement holds its locks only briefly.
        for task_id in queued:
            effects = Effects()
            async with self.engine.begin() as conn:
                task = await sql_tasks.lock_if_queued(conn, task_id)
                if task is None:
                    continue  # another replica has it, or it moved on
                shape = (task["site_id"], task["tenant_id"], task["provider"], task["operation"],
                         task["op_class"], task["requires_fips"], tuple(task["features"]))  # fmt: skip
                if shape in blocked:
                    continue
                if await self._place(conn, task, effects, refuse=False) == S.LEASED:
                    placed += 1
                else:
                    blocked.add(shape)
            await effects.run()
        return placed

    async def _reevaluate_for(self, collector_id: str) -> None:
        async with self.engine.connect() as conn:
            site_id = await sql_collectors.collector_site(conn, collector_id)
        if site_id is not None:
            await self.reevaluate(site_id)
