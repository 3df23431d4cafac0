"""Running one claimed task: the envelope verified in the documented order, receipt journaled
before the driver runs, device credentials opened (relayed or from the external vault), and
the outcome reconciled locally when the journal already holds one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from contextlib import nullcontext
from typing import Any

from structlog.contextvars import bind_contextvars

from collector.agent_state import log
from collector.drivers.base import Outcome, Supplied, Task, WindowClosed
from collector.journal import AlreadyReceived, Result, task_key
from collector.output import TaskOutput, UploadFailed
from collector.reporting import Reporting
from collector.vault_settings import VaultError
from common.envelope.canonical import OpClass
from common.envelope.codes import EnvelopeError, Rejection
from common.envelope.verify import VerifyContext, verify
from common.protocol import floor_of
from common.telemetry import trace_context
from common.telemetry.span_record import TaskTrace
from common.trust import signed_doc
from common.trust.credential_relay import RelayError, open_for
from common.trust.signed_doc import RELAYED_CREDENTIAL, DocumentError


class Execution(Reporting):
    """One claimed task from its envelope to its result."""

    def _accept(
        self, dispatch_id: str, raw: bytes, relayed: object = None, traceparent: str = ""
    ) -> Coroutine[Any, Any, None] | None:
        """Verify and journal the receipt before anything runs; execution continues in the background.

        Returns the refusal report to send (before the next claim) when the envelope is refused.
        ``traceparent``: the gateway's hand-out span, when the task is traced (its spans are
        recorded here and sent home with the report; common/telemetry/span_record.py).
        """
        ctx = VerifyContext(
            collector_id=self.collector_id,
            now=self.clock.now(time.time()),
            trusted_keys=self.trusted,
            seen=self.journal,
            journal=self.journal,
        )
        handed = trace_context.parse(traceparent)
        trace = TaskTrace(handed) if handed is not None and handed.sampled else None
        try:
            with trace.span("versus.collector.verify") if trace else nullcontext():
                accepted = verify(raw, ctx)
        except EnvelopeError as exc:
            if trace is not None:
                trace.root.set("versus.error_code", exc.code.value)
            if exc.code == Rejection.WRONG_COLLECTOR:
                log.error("envelope addressed to another collector: possible attack", dispatch_id=dispatch_id)
            else:
                log.warning("envelope refused", dispatch_id=dispatch_id, code=exc.code.value)
            return self._report_refusal(dispatch_id, exc.code.value, exc.message, trace)
        f = accepted.envelope.fields
        read = f.op_class == OpClass.READ.value
        try:
            self.journal.record_receipt(f.task_id, f.idempotency_key, f.provider)
        except AlreadyReceived:
            return None
        if accepted.journaled is not None and not read:
            known = self.journal.result(f.idempotency_key)
            assert known is not None
            log.info("idempotency key already journaled; answering from the journal", task_id=f.task_id)
            self.journal.record_result(f.task_id, f.idempotency_key, known)
            self._spawn(self._report(f.task_id, known))
            return None
        # A stream only where the control plane takes one (protocol 4); it starts at the first write.
        output = None
        if self.client.protocol >= floor_of("output_stream"):
            output = TaskOutput(
                self.options.state_dir, f.task_id, self.client.output, self.options.max_backoff_s
            )
        task = Task(
            f.task_id, f.operation, f.target_ref, f.idempotency_key, accepted.envelope.params, f.lease_epoch,
            expires_at=f.expires_at, clock=self._now, output=output,
        )  # fmt: skip
        if self.vault_mode == "relayed":
            self._open_relayed(relayed, f.task_id, task.supplied)
        self.in_flight[f.provider] = self.in_flight.get(f.provider, 0) + 1
        self._spawn(self._execute(f.provider, task, read, trace))
        return None

    def _open_relayed(self, document: object, dispatch_id: str, supplied: Supplied) -> None:
        """The credential relayed with a dispatch (vault mode B): verified as the control plane's,
        opened with this collector's key for this dispatch only; or the code it failed with."""
        if document is None:
            supplied.set(None)  # nothing stored for the device: the driver says no_credentials
            return
        try:
            payload = signed_doc.verify(
                document, self.trusted, kind=RELAYED_CREDENTIAL, collector_id=self.collector_id,
                now=int(self._now()),
            )  # fmt: skip
            value = open_for(self._identity_key, self.collector_id, dispatch_id, payload)
        except (DocumentError, RelayError) as exc:
            log.error("relayed credential refused", task_id=dispatch_id, code=exc.code)
            supplied.fail("credential_relay_invalid", "the credential relayed with this task did not open")
            return
        supplied.set(value)

    async def _execute(self, provider: str, task: Task, read: bool, trace: TaskTrace | None = None) -> None:
        if trace is not None:
            # This task's log lines name its trace (the task runs in a context of its own).
            bind_contextvars(trace_id=f"{trace.trace_id:032x}", span_id=f"{trace.root.span_id:016x}")
            trace.root.set("versus.dispatch_id", task.task_id)
            trace.root.set("versus.operation", task.operation)
        try:
            try:
                with trace.span("versus.collector.execute", provider=provider) if trace else nullcontext():
                    outcome = await self._run_driver(provider, task)
                if outcome.status == "unknown":
                    with trace.span("versus.collector.reconcile") if trace else nullcontext():
                        outcome = await self._reconcile_locally(provider, task, outcome)
            except WindowClosed as exc:
                # Not attempted: a refusal, journaled apart from the key so a retry may still run it.
                log.warning("envelope window passed before the device write; not executed",
                            task_id=task.task_id, expires_at=task.expires_at)  # fmt: skip
                refusal = Result("refused", b"", exc.code, str(exc))
                self.journal.record_result(task.task_id, task_key(task.task_id), refusal)
                await self._report(task.task_id, refusal, trace=trace)
                return
        finally:
            self.in_flight[provider] -= 1
            self.slot_freed.set()
            # Whatever credential the task held is wiped with it (a relayed one above all).
            for held in task.held:
                held.scrub()
            task.supplied.scrub()
        digest = None
        stream = task.output if isinstance(task.output, TaskOutput) and task.output.started else None
        if stream is not None:
            try:
                digest = await stream.finish()  # the report vouches only for output the control plane holds
            except asyncio.CancelledError:
                stream.abandon()  # stopping hard: the upload goes with the task
                raise
            except UploadFailed as exc:
                stream.remove()
                stream = None
                if read and outcome.status == "success":
                    outcome = Outcome("failed", b"", exc.code, f"the output could not be delivered: {exc}")
        result = Result(outcome.status, outcome.result, outcome.error_code, outcome.error_message)
        # A read's answer is about that moment only (a reconcile-read above all): it must never
        # answer a later envelope with the same idempotency key, so it is journaled per task; so
        # is a cancel that changed nothing, which leaves the key free for a later attempt.
        key = task_key(task.task_id) if read or outcome.status == "cancelled" else task.idempotency_key
        self.journal.record_result(task.task_id, key, result)
        await self._report(task.task_id, result, digest, stream, trace)

    async def _run_driver(self, provider: str, task: Task) -> Outcome:
        driver = self.drivers.get(provider)
        op = driver.operations.get(task.operation) if driver else None
        if driver is None or op is None:
            return Outcome(
                "failed", b"", "operation_not_supported", f"{provider}/{task.operation} is not installed"
            )
        async with self.slots[provider]:
            # Waiting for a slot (or a stopped process) may have outlived the envelope.
            if not task.window_open():
                task.check_window()
            if self.vault_mode == "external" and getattr(driver, "uses_credentials", True):
                await self._read_external(provider, task)
            return await self.running.run(task, driver.execute(task), op.timeout_s, op.op_class == "read")

    async def _read_external(self, provider: str, task: Task) -> None:
        """Vault mode C: the device's credential, read from the customer's Vault for this task
        (collector/external_vault.py); a failure is the code the driver fails the task with."""
        try:
            if self.external is None:
                raise self.external_error or VaultError("vault_config_invalid", "no Vault integration")
            task.supplied.set(await self.external.read(provider, task.target_ref))
        except VaultError as exc:
            log.error("device credential not read from the Vault", task_id=task.task_id, code=exc.code)
            task.supplied.fail(exc.code, str(exc))

    async def _reconcile_locally(self, provider: str, task: Task, unclear: Outcome) -> Outcome:
        """For a reconcilable mutation, ask the driver's reconcile-read before giving up as unknown."""
        driver = self.drivers[provider]
        op = driver.operations.get(task.operation)
        if op is None or op.op_class != "mutate_reconcilable" or not op.reconcile_operation:
            return unclear
        check = Task(
            task.task_id, op.reconcile_operation, task.target_ref, task.idempotency_key, task.params, 0
        )  # a read: no window check, it changes nothing
        answer = await self._run_driver(provider, check)
        if answer.status == "success":
            return Outcome("success", answer.result, "", "reconciled locally: applied")
        if answer.status == "failed" and answer.error_code == "":
            return Outcome("failed", b"", "not_applied", "reconciled locally: the change did not land")
        return unclear
