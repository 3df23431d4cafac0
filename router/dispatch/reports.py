"""Reports from collectors (verified against their signatures), operator resolution and reads of
a task with its history. Cancel is in router/dispatch/cancels.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy.ext.asyncio import AsyncConnection

from common.errors import Conflict, FailedPrecondition, NotFound, PermissionDenied
from common.telemetry import tracing
from common.telemetry.logs import get_logger
from common.trust import report_signature
from common.trust.report_signature import ReportSignatureError, ReportStatement
from router.core import store
from router.core.base import Effects, _now
from router.core.metrics import DISPATCH_STATES
from router.core.sql import Row
from router.core.states import State, check_transition
from router.dispatch import ladder, sql_collectors, sql_dispatches, sql_leases, sql_tasks
from router.dispatch.core import MAX_CACHED_REPORT_KEYS, ReportResult
from router.dispatch.outcomes import Outcomes
from router.output.streams import Outputs

S = State
# The dispatch states a final report leaves behind.
ANSWERED = frozenset({S.SUCCESS, S.FAILED, S.UNKNOWN, S.CANCELLED})
log = get_logger("versus.router")


class Reports(Outcomes, Outputs):
    """Reports, resolve and reads."""

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
        output: tuple[int, str] | None = None,
    ) -> ReportResult:
        """Record a collector's report on a dispatch it was given; see docs/router.md for the rules.

        ``refused``: the collector refused the envelope with ``error_code`` and did not run it
        (:func:`router.dispatch.ladder.on_refusal` says what that means for the task).
        ``signature``: the collector's signature over the report (common/trust/report_signature.py),
        checked against its key in PostgreSQL before anything is recorded, then kept with the
        dispatch. Every report from a collector carries one (the bridge passes ``""`` when it is
        missing, which is refused); ``None`` is for callers inside the router's own process.
        ``output``: the (length, SHA-256 hex) of the output the collector streamed (protocol 4),
        checked against what is stored (router/output/streams.py).
        """
        attributes = {"versus.dispatch_id": dispatch_id, "versus.collector_id": collector_id,
                      "versus.reported": "refused" if refused else outcome.value}  # fmt: skip
        with tracing.span("versus.task.outcome", attributes=attributes) as span:
            answer = await self._reported(
                collector_id,
                dispatch_id,
                outcome,
                result,
                error_code,
                error_message,
                refused,
                signature,
                output,
            )
            span.set("versus.state", answer.state.value)
            if answer.duplicate:
                span.set("versus.duplicate", True)
            return answer

    async def _reported(
        self, collector_id: str, dispatch_id: str, outcome: State, result: bytes, error_code: str,
        error_message: str, refused: bool, signature: str | None, output: tuple[int, str] | None,
    ) -> ReportResult:  # fmt: skip
        statement = ReportStatement(
            collector_id,
            dispatch_id,
            "refused" if refused else outcome.value,
            result,
            error_code,
            error_message,
            output_length=None if output is None else output[0],
            output_sha256="" if output is None else output[1],
        )
        # Verified once here when the kept key can: the general path below then does not again.
        verified = signature is not None and self._verified_by_kept_key(statement, signature)
        if refused:
            outcome = S.FAILED
        elif verified and output is None and outcome in sql_tasks.ANSWER_AT_ONCE_OUTCOMES:
            assert signature is not None
            # The common report — success or failure of a running task — in one statement; anything
            # else (a duplicate, someone else's dispatch, a task that moved on) takes the path below.
            answered = await self._answer_at_once(
                collector_id, dispatch_id, outcome, result, error_code, error_message, signature
            )
            if answered is not None:
                return answered
        effects = Effects()
        # One transaction: the task (locked first, as everywhere), then its dispatch; who speaks and
        # whether they signed it is checked before anything changes. A refusal is audited, committed,
        # and raised after the transaction.
        refusal: Exception | None = None
        async with self.engine.begin() as conn:
            task = await sql_tasks.task_of_dispatch(conn, dispatch_id, lock=True)
            d = await store.get_dispatch(conn, dispatch_id, lock=True) if task is not None else None
            if d is not None and d["collector_id"] != collector_id:
                # Speaking about another collector's work is recorded: it may be an attack.
                await store.audit(
                    conn,
                    collector_id,
                    "report.foreign_dispatch",
                    str(d["task_id"]),
                    {"dispatch_id": dispatch_id},
                )
                log.warning("report for another collector's dispatch", collector_id=collector_id)
            if task is None or d is None or d["collector_id"] != collector_id:
                # The same answer for "unknown" and "someone else's": a collector learns nothing about others.
                refusal = PermissionDenied(
                    f"dispatch {dispatch_id!r} was not dispatched to you", code="not_your_dispatch"
                )
            elif signature is not None and not verified:
                try:
                    await self._check_report_signature(conn, statement, signature)
                except ReportSignatureError as exc:
                    await store.audit(
                        conn, collector_id, "report.bad_signature", str(d["task_id"]),
                        {"dispatch_id": dispatch_id, "code": exc.code},
                    )  # fmt: skip
                    log.warning("report signature refused", collector_id=collector_id, code=exc.code)
                    refusal = exc
            if refusal is None:
                assert task is not None and d is not None
                if d["reported_at"] is not None and d["state"] in ANSWERED:
                    same = d["state"] == outcome.value and bytes(d["result"] or b"") == result
                    if same:
                        return ReportResult(True, State(task["state"]))
                    raise Conflict(
                        "a different terminal report was already recorded", code="conflicting_report"
                    )
                if d["state"] not in (S.DISPATCHED, S.RUNNING):
                    raise FailedPrecondition(
                        f"dispatch is {d['state']}; no report expected", code="report_not_expected"
                    )
                # The report's signature is kept with the dispatch, in the same statement as the report.
                signed = {"report_signature": signature} if signature is not None else {}
                mismatch = "" if refused else await self._check_output(conn, d, output)
                if mismatch and outcome == S.SUCCESS:
                    outcome, error_code = S.FAILED, mismatch
                    error_message = "the output stored differs from what the collector says it sent"
                if refused:
                    state = await self._refused(conn, task, d, error_code, error_message, effects, signed)
                else:
                    state = await self._apply_report(
                        conn, task, d, outcome, result, error_code, error_message, effects, signed
                    )
        if refusal is not None:
            raise refusal
        await effects.run()
        return ReportResult(False, state)

    def _verified_by_kept_key(self, statement: ReportStatement, signature: str) -> bool:
        """Whether the collector's kept key verifies the report (no key kept, or a refusal: the
        general path decides, reading the key on record and auditing a bad signature)."""
        key = self._report_keys.get(statement.collector_id)
        if key is None:
            return False
        try:
            report_signature.verify(signature, key, statement)
        except ReportSignatureError:
            return False
        return True

    async def _answer_at_once(
        self,
        collector_id: str,
        dispatch_id: str,
        outcome: State,
        result: bytes,
        error_code: str,
        error_message: str,
        signature: str,
    ) -> ReportResult | None:
        """The report as one autocommitted statement (sql_tasks.answer_at_once); None: not that case."""
        answered = _answer(outcome, result, error_code, error_message, {"report_signature": signature})
        async with self.autocommit.connect() as conn:
            task = await sql_tasks.answer_at_once(
                conn,
                dispatch_id,
                collector_id,
                answered,
                result=result,
                error_code=error_code or None,
                reason=error_code or outcome.value,
            )
        if task is None:
            return None
        effects = Effects()
        self._freed(task, collector_id, task["provider"], outcome, effects, fill=task["queued_behind"])
        await effects.run()
        return ReportResult(False, outcome)

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
        der = await sql_collectors.collector_public_key(conn, cid)
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
        task: Row,
        d: Row,
        outcome: State,
        result: bytes,
        error_code: str,
        error_message: str,
        effects: Effects,
        signed: Mapping[str, str] | None = None,
    ) -> State:
        task_id, dispatch_id, current = task["task_id"], d["dispatch_id"], State(task["state"])
        if outcome == S.RUNNING:
            await sql_dispatches.update_dispatch(conn, dispatch_id, state=S.RUNNING.value, **(signed or {}))
            if d["kind"] == "execute" and current == S.DISPATCHED:
                await sql_tasks.transition(
                    conn, task_id, S.DISPATCHED, S.RUNNING, "collector started it", dispatch_id
                )
                return S.RUNNING
            return current
        if outcome == S.CANCELLED and not (
            d["kind"] == "execute" and current in (S.DISPATCHED, S.RUNNING) and task["cancel_requested_at"]
        ):
            # Stopped without being asked (or on a dispatch that no longer decides the task): nothing
            # changed, which for the task is a failure of this attempt, not a cancel.
            outcome, error_code = S.FAILED, error_code or "cancelled_unrequested"
        if (
            d["kind"] == "execute"
            and current in (S.DISPATCHED, S.RUNNING)
            and outcome in (S.SUCCESS, S.FAILED, S.CANCELLED)
        ):
            # The common case, one statement: the answer, the device released, the task finished.
            check_transition(current, outcome)
            moved = await sql_tasks.transitions(
                conn,
                task_id,
                [(current, outcome, error_code or outcome.value)],
                dispatch_id,
                answered=_answer(outcome, result, error_code, error_message, signed),
                release_lease_of=task["target_ref"],
                result=result,
                error_code=error_code or None,
            )
            assert moved is not None
            self._slot_freed(task, d, outcome, effects)
            return outcome
        await self._answered(conn, task, d, outcome, result, error_code, error_message, effects, signed)
        if d["kind"] == "reconcile":
            return await self._after_reconcile(conn, task, d, outcome, result, effects, error_code=error_code)
        if current not in (S.DISPATCHED, S.RUNNING):
            return current  # the task moved on (for instance cancelled or resolved); keep the report only
        evidence = f"collector {d['collector_id']} reported unknown: {error_code} {error_message}".strip()
        await sql_tasks.transition(
            conn, task_id, current, S.UNKNOWN, "collector reported unknown", dispatch_id, evidence=evidence
        )
        return await self._climb(conn, task, evidence, effects)

    async def _answered(
        self,
        conn: AsyncConnection,
        task: Row,
        d: Row,
        outcome: State,
        result: bytes,
        error_code: str,
        error_message: str,
        effects: Effects,
        signed: Mapping[str, str] | None = None,
    ) -> None:
        """Record the collector's final answer on a dispatch (and ``signed``: its report
        signature); its slot is free again."""
        values = _answer(outcome, result, error_code, error_message, signed)
        if values["report_signature"] is None:
            del values["report_signature"]  # a report from inside the router: keep what is recorded
        await sql_dispatches.update_dispatch(conn, d["dispatch_id"], reported_at=_now(), **values)
        self._slot_freed(task, d, outcome, effects)

    def _slot_freed(self, task: Row, d: Row, outcome: State, effects: Effects) -> None:
        """After the commit: one in-flight dispatch fewer, and the freed slot offered to the oldest
        queued task that could use it."""
        self._freed(task, d["collector_id"], d["provider"], outcome, effects, fill=True)

    def _freed(
        self, task: Row, collector: str, provider: str, outcome: State, effects: Effects, *, fill: bool
    ) -> None:
        """:meth:`_slot_freed`; without ``fill`` when no queued task could use the slot (the
        statement that freed it looked)."""
        DISPATCH_STATES.labels(outcome.value).inc()
        effects.add(lambda: self.in_flight.add(collector, provider, -1))
        if fill:
            site_id, tenant_id = task["site_id"], task["tenant_id"]
            effects.add(self._in_background(lambda: self.fill_slot(site_id, tenant_id, provider, collector)))

    async def _refused(
        self,
        conn: AsyncConnection,
        task: Row,
        d: Row,
        code: str,
        message: str,
        effects: Effects,
        signed: Mapping[str, str] | None = None,
    ) -> State:
        """A collector refused an envelope: it never ran it there."""
        current = State(task["state"])
        verdict = ladder.on_refusal(code)
        if verdict is ladder.Refusal.ALREADY_HELD:
            if signed:
                await sql_dispatches.update_dispatch(conn, d["dispatch_id"], **signed)
            return current  # the collector holds this dispatch already; its real report follows
        dispatch_id, task_id, collector = d["dispatch_id"], task["task_id"], d["collector_id"]
        error_code = f"envelope_refused:{code}"
        await self._answered(conn, task, d, S.FAILED, b"", error_code, message, effects, signed)
        if d["kind"] == "reconcile":
            return await self._after_reconcile(conn, task, d, S.FAILED, b"", effects, refused=True)
        if verdict is ladder.Refusal.REROUTE and current == S.DISPATCHED:
            if await self._cancelled_instead(conn, task, current, f"refused by {collector}", dispatch_id):
                return S.CANCELLED
            # Never run, so safe anywhere else; placement skips every collector that refused it.
            await sql_tasks.transition(
                conn, task_id, S.DISPATCHED, S.QUEUED,
                f"collector {collector} refused it ({code}); placing it elsewhere", dispatch_id,
            )  # fmt: skip
            effects.add(self._reevaluate_effect(task["site_id"]))
            return S.QUEUED
        if current not in (S.DISPATCHED, S.RUNNING):
            return current
        await sql_leases.release_lease(conn, task["target_ref"], task_id)
        await sql_tasks.transition(
            conn, task_id, current, S.FAILED, error_code, dispatch_id, error_code=error_code,
        )  # fmt: skip
        return S.FAILED

    async def resolve(self, task_id: str, outcome: State, note: str, actor: str) -> Row:
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
            await sql_tasks.transition(
                conn, task_id, S.INDETERMINATE, outcome, f"resolved by {actor}: {note}", resolved_by=actor
            )
            await store.audit(conn, actor, f"task.resolve.{outcome.value}", task_id, {"note": note})
            resolved = await store.get_task(conn, task_id)
        assert resolved is not None
        return resolved

    async def get(self, task_id: str) -> tuple[Row, Sequence[Row]]:
        async with self.engine.connect() as conn:
            task = await store.get_task(conn, task_id)
            if task is None:
                raise NotFound(f"task {task_id!r} does not exist", code="task_not_found")
            if task["current_dispatch_id"]:
                # The current attempt's streamed output, so far (router/output/streams.py).
                d = await store.get_dispatch(conn, task["current_dispatch_id"])
                if d is not None:
                    task = {
                        **task, "output_length": d["output_length"], "output_sha256": d["output_sha256"],
                        "collector_id": d["collector_id"],
                    }  # fmt: skip
            return task, await sql_tasks.history(conn, task_id)


def _answer(
    outcome: State, result: bytes, error_code: str, error_message: str, signed: Mapping[str, str] | None
) -> dict[str, object]:
    """The columns a final answer writes on its dispatch (router/dispatch/sql_tasks.py ``ANSWER_COLUMNS``)."""
    return {
        "state": outcome.value,
        "result": result,
        "error_code": error_code or None,
        "error_message": error_message[:1000] or None,
        "report_signature": (signed or {}).get("report_signature"),
    }
