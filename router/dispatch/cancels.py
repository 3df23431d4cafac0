"""Cancel, and the verdicts a resuming collector gets for the tasks it holds (docs/protocol.md).

- **Before a collector has the work** (queued, routed, leased) a cancel ends the
  task at once.
- **While a collector holds it** (dispatched, running) a cancel is a request: it
  is recorded on the task (``cancel_requested_at``), noted for the collector in
  Redis and its held claim woken, so the next claim answer tells it to stop. The
  task ends when the collector answers: ``cancelled`` when it stopped before
  anything changed, otherwise whatever it reports, and an unknown outcome goes
  down the ladder as always. Only a collector that took the task under protocol
  3 or later honours that (``cancel_unsupported`` otherwise; a task submitted
  with the ``cancel`` feature is placed only on such collectors).
- **In the ladder** (unknown, reconciling) a cancel is recorded and the ladder
  ends the task ``cancelled`` where it would otherwise have tried again.

Redis only speeds delivery up: PostgreSQL holds the request, a resume claim
is answered from it, and the sweeper notes again any cancel not answered
within :data:`RENOTIFY_AFTER_S` (a Redis flush loses nothing).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Collection, Mapping

from common import protocol
from common.errors import FailedPrecondition, NotFound
from common.redis.keys import CANCEL
from router.core import store
from router.core.base import Effects
from router.core.sql import Row
from router.core.states import CANCEL_AT_ONCE, CANCEL_BY_REQUEST, State
from router.dispatch import sql_dispatches, sql_leases, sql_tasks
from router.dispatch.outcomes import Outcomes

S = State
# How long a driver may take to stop cooperatively before the collector stops it by force.
CANCEL_GRACE_S = 10
# A cancel the collector has not answered after this long is noted for it again.
RENOTIFY_AFTER_S = 15


class Verdict(enum.StrEnum):
    """What a collector does with a task it holds."""

    CONTINUE = "continue"
    CANCEL = "cancel"
    TERMINATE = "terminate"


def verdict(held: Mapping[str, object] | None) -> Verdict:
    """The verdict on one held dispatch, from its row joined with its task's (None: no such
    dispatch of this collector). Pure.

    A dispatch already answered is finishing (its report is on the way again): continue. One the
    task has moved on from (lease lost, ended, handed elsewhere) has nobody waiting for it:
    terminate. Otherwise continue, or cancel when a cancel was asked for.
    """
    if held is None:
        return Verdict.TERMINATE
    if held["reported_at"] is not None:
        return Verdict.CONTINUE
    in_hand = held["state"] in (S.DISPATCHED.value, S.RUNNING.value)
    current = held["current_dispatch_id"] == held["dispatch_id"]
    if not (in_hand and current):
        return Verdict.TERMINATE
    if held["kind"] == "execute":
        if held["task_state"] not in (S.DISPATCHED.value, S.RUNNING.value):
            return Verdict.TERMINATE
        return Verdict.CANCEL if held["cancel_requested_at"] is not None else Verdict.CONTINUE
    # A reconcile-read decides how the task ends, cancel or not: it runs to its answer.
    return Verdict.CONTINUE if held["task_state"] == S.RECONCILING.value else Verdict.TERMINATE


class Cancels(Outcomes):
    """Cancel requests, their delivery, and resume verdicts."""

    async def cancel(self, task_id: str, reason: str) -> Row:
        """Cancel the task, or ask its collector to stop it (see the module doc)."""
        effects = Effects()
        notify: tuple[str, str] | None = None
        async with self.engine.begin() as conn:
            task = await store.get_task(conn, task_id, lock=True)
            if task is None:
                raise NotFound(f"task {task_id!r} does not exist", code="task_not_found")
            current = State(task["state"])
            if current == S.CANCELLED or (current in CANCEL_BY_REQUEST and task["cancel_requested_at"]):
                return task  # asked before: the same answer again
            why = reason or "cancelled by caller"
            if current in CANCEL_AT_ONCE:
                if task["current_dispatch_id"] and current == S.LEASED:
                    d = await store.get_dispatch(conn, task["current_dispatch_id"], lock=True)
                    if d is not None and d["state"] == S.LEASED:
                        await self._abandon(conn, d, effects, S.CANCELLED.value)
                await sql_leases.release_lease(conn, task["target_ref"], task_id)
                await sql_tasks.transition(conn, task_id, current, S.CANCELLED, why)
            elif current in CANCEL_BY_REQUEST:
                if current in (S.DISPATCHED, S.RUNNING):
                    d = await store.get_dispatch(conn, task["current_dispatch_id"])
                    assert d is not None
                    _check_honoured(d)
                    notify = (d["collector_id"], d["dispatch_id"])
                await sql_tasks.transition(
                    conn, task_id, current, current, f"cancel requested: {why}",
                    cancel_requested_at=dt.datetime.now(dt.UTC),
                )  # fmt: skip
            else:
                raise FailedPrecondition(
                    f"a {current.value} task cannot be cancelled: it has finished or waits for an operator",
                    code="not_cancellable",
                )
            answer = await store.get_task(conn, task_id)
        await effects.run()
        if notify is not None:
            await self._tell_collector(*notify)
        assert answer is not None
        return answer

    async def _tell_collector(self, collector_id: str, dispatch_id: str) -> None:
        await self.liveness.note_cancel(collector_id, dispatch_id)
        await self.wake.publish(collector_id, CANCEL)

    async def verdicts(self, collector_id: str, held: Collection[str]) -> dict[str, Verdict]:
        """A verdict on every dispatch in ``held`` (a resume claim's held ids), from PostgreSQL."""
        if not held:
            return {}
        async with self.autocommit.connect() as conn:
            rows = {
                r["dispatch_id"]: r
                for r in await sql_dispatches.held_dispatches(conn, collector_id, list(held))
            }
        return {dispatch_id: verdict(rows.get(dispatch_id)) for dispatch_id in held}

    async def renotify_cancels(self) -> int:
        """Note again every cancel its collector has not answered for a while (Redis may have lost
        the note, or the answer carrying it was lost); the number noted."""
        async with self.autocommit.connect() as conn:
            pending = await sql_dispatches.unanswered_cancels(conn, RENOTIFY_AFTER_S)
        for row in pending:
            await self._tell_collector(row["collector_id"], row["dispatch_id"])
        return len(pending)


def _check_honoured(d: Row) -> None:
    floor = protocol.floor_of("cancel")
    handed = int(d["handed_protocol"] or 1)
    if handed < floor:
        raise FailedPrecondition(
            f"collector {d['collector_id']} took this task under protocol {handed}; stopping running "
            f"work needs protocol {floor} or later (submit with the 'cancel' feature to be sure of it)",
            code="cancel_unsupported",
            details={"collector_id": d["collector_id"], "protocol": str(handed), "floor": str(floor)},
        )
