"""The drivers running now, and stopping them on the control plane's verdicts (protocol 3).

A claim answer may carry a verdict on a task this collector holds
(docs/protocol.md, cancel and resume verdicts):

- ``continue``: nothing to do;
- ``cancel``: ask the driver to stop (:class:`collector.drivers.base.StopSignal`),
  and stop it by force once the grace period has passed;
- ``terminate``: nobody waits for the task any more: stop it by force now.

What a stopped task reports is decided here, from whether its device writes had
begun, never from the driver's word alone (:func:`stopped_outcome`): a read, or
a mutation stopped before its first write, is ``cancelled``; a mutation stopped
after it is ``unknown``, and the unknown-outcome ladder finds out what landed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

from collector.drivers.base import DriverError, Outcome, Stopped, Task, WindowClosed
from common.telemetry.logs import get_logger

log = get_logger("versus.collector")

# Revocations answered, remembered so one carried again answers the same (bounded: oldest forgotten).
ANSWERED_REVOCATIONS = 256


def stopped_outcome(task: Task, read: bool) -> Outcome:
    """What a task stopped on a cancel or a revoke with kill (cooperatively or by force) reports.

    Pure. A revoke is not a cancel: nothing asked for the task to end, so a task it stopped before
    any change failed (``credential_revoked``)."""
    if task.stop.reason == "credential_revoked":
        if read or not task.stop.writes_started:
            return Outcome("failed", b"", "credential_revoked", "stopped: its credential was revoked")
        return Outcome(
            "unknown", b"", "credential_revoked_mid_change",
            "stopped after its change began, its credential revoked; whether the device applied it "
            "is not known",
        )  # fmt: skip
    how = "by force after the grace period" if task.stop.forced else "on a cancel"
    if read or not task.stop.writes_started:
        return Outcome("cancelled", b"", "cancelled", f"stopped {how} before changing anything")
    return Outcome(
        "unknown", b"", "cancelled_mid_change",
        f"stopped {how} after its change began; whether the device applied it is not known",
    )  # fmt: skip


class RunningTasks:
    """Drivers in flight by dispatch id (the envelope's task id)."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[Task, asyncio.Task[Outcome]]] = {}
        self._answered: OrderedDict[str, dict[str, str]] = OrderedDict()

    def __contains__(self, dispatch_id: object) -> bool:
        return dispatch_id in self._running

    def __len__(self) -> int:
        return len(self._running)

    async def run(
        self, task: Task, execution: Coroutine[Any, Any, Outcome], timeout_s: float, read: bool
    ) -> Outcome:
        """Run one driver call to its outcome: its own, a timeout's (unknown), an error's (failed),
        or a stop's (:func:`stopped_outcome`). :class:`WindowClosed` is raised, as before."""
        runner = asyncio.ensure_future(_within(execution, timeout_s))
        self._running[task.task_id] = (task, runner)
        try:
            await asyncio.wait([runner])
        except asyncio.CancelledError:
            runner.cancel()  # the collector itself is stopping hard: take the driver with it
            raise
        finally:
            self._running.pop(task.task_id, None)
        if runner.cancelled():
            return stopped_outcome(task, read)
        try:
            return runner.result()
        except TimeoutError:
            return Outcome("unknown", b"", "timeout", f"no answer within {timeout_s:g}s")
        except WindowClosed:
            raise
        except Stopped:
            return stopped_outcome(task, read)
        except DriverError as exc:
            return Outcome("failed", b"", exc.code, str(exc))

    def apply(self, verdicts: Mapping[str, str], grace_s: float) -> None:
        """Act on the verdicts for tasks running here (others were finished or never ran here)."""
        loop = asyncio.get_running_loop()
        for dispatch_id, said in verdicts.items():
            entry = self._running.get(dispatch_id)
            if entry is None or said == "continue":
                continue
            task, runner = entry
            if said == "cancel" and not task.stop.requested:
                log.info("cancel: asking the driver to stop", task_id=dispatch_id, grace_s=grace_s)
                task.stop.event.set()
                loop.call_later(grace_s, _force, task, runner)
            elif said == "terminate":
                log.warning(
                    "terminate: nobody waits for this task any more; stopping it", task_id=dispatch_id
                )
                task.stop.event.set()
                _force(task, runner)

    def revoke(self, revocation_id: str, dispatch_ids: Iterable[str], kill: bool) -> dict[str, str]:
        """Take a credential back from these dispatches (protocol 5): wipe what each task holds and,
        with ``kill``, stop the tasks that held one. What was actually done, per dispatch.

        A revocation is carried until its ack is recorded, so it can arrive again while the first
        ack is on its way; it then answers what was done the first time (a task the first delivery
        killed is gone, and "not_held" would be false)."""
        if revocation_id in self._answered:
            self._answered.move_to_end(revocation_id)
            return dict(self._answered[revocation_id])
        results: dict[str, str] = {}
        for dispatch_id in dispatch_ids:
            entry = self._running.get(dispatch_id)
            if entry is None or not entry[0].held:
                results[dispatch_id] = "not_held"  # finished, never started here, or took none
                continue
            task, runner = entry
            try:
                for held in task.held:
                    held.scrub()
            except Exception as exc:  # reported to the control plane as failed
                results[dispatch_id] = f"failed: {type(exc).__name__}"
                continue
            results[dispatch_id] = "scrubbed"
            if kill:
                task.stop.reason = "credential_revoked"
                task.stop.event.set()
                _force(task, runner)
                results[dispatch_id] = "killed"
        log.warning("credential revoked from running tasks", results=results, kill=kill)
        self._answered[revocation_id] = dict(results)
        while len(self._answered) > ANSWERED_REVOCATIONS:
            self._answered.popitem(last=False)
        return results


def _force(task: Task, runner: asyncio.Task[Outcome]) -> None:
    if not runner.done():
        log.warning("driver did not stop in time; stopping it by force", task_id=task.task_id)
        task.stop.forced = True
        runner.cancel()


async def _within(execution: Coroutine[Any, Any, Outcome], timeout_s: float) -> Outcome:
    """``execution``'s outcome, or TimeoutError after ``timeout_s`` (asyncio.timeout: Python 3.11's
    wait_for can lose a cancel that lands as the awaited call finishes)."""
    async with asyncio.timeout(timeout_s):
        return await execution
