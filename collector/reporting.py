"""Reporting a task's result: signed reports retried until the gateway acknowledges them, refusals
that a fresh request can fix told apart from final ones, and revocation acknowledgements."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping
from typing import Any

from collector.agent_state import AgentState, backoff, log
from collector.gateway_errors import GatewayRefused, GatewayUnavailable
from collector.journal import Result
from collector.output import TaskOutput, UploadFailed
from common.telemetry.span_record import TaskTrace

# Refusals of a report that a fresh request can fix: the token was altered, moved or replayed on the
# way, or the clocks disagree (docs/threat-model.md). Any other refusal is final.
RETRYABLE_REPORT_REFUSALS = frozenset(
    {"bearer_wrong_body", "bearer_wrong_path", "bearer_wrong_method", "bearer_replayed",
     "bearer_not_yet_valid", "bearer_expired"}
)  # fmt: skip


class Reporting(AgentState):
    """Reports and revocation acknowledgements, retried until the gateway answers."""

    # --- reporting ----------------------------------------------------------------------------------
    async def _report(
        self,
        task_id: str,
        result: Result,
        digest: tuple[int, str] | None = None,
        stream: TaskOutput | None = None,
        trace: TaskTrace | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "task_id": task_id,
            "outcome": result.outcome,
            "error_code": result.error_code,
            "error_message": result.error_message[:4000],
        }
        if result.outcome != "refused":
            body["result_b64"] = base64.b64encode(result.result).decode()
        if digest is not None:
            body["output"] = {"length": digest[0], "sha256": digest[1]}
        if trace is not None:
            body["trace"] = trace.finish(result.outcome)
        await self._send_report(task_id, body, stream=stream)
        if digest is not None:
            (stream or TaskOutput(self.options.state_dir, task_id, self.client.output)).remove()

    async def _ack_revocation(self, revocation_id: str, results: Mapping[str, str]) -> None:
        """Tell the control plane what was scrubbed, until it has it (a lost ack leaves the
        revocation unanswered: the next resume claim carries it again and we answer again)."""
        attempt = 0
        while not self.stopping.is_set():
            try:
                await self.client.revoked(revocation_id, results)
                return
            except GatewayRefused as exc:
                log.error("revocation ack refused", revocation_id=revocation_id, code=exc.code)
                return
            except GatewayUnavailable as exc:
                await self._sleep(
                    backoff(attempt, base=0.5, cap=self.options.max_backoff_s), f"revoked: {exc}"
                )
                attempt += 1

    async def _report_refusal(
        self, task_id: str, code: str, message: str, trace: TaskTrace | None = None
    ) -> None:
        body: dict[str, Any] = {
            "task_id": task_id, "outcome": "refused", "error_code": code, "error_message": message[:4000]
        }  # fmt: skip
        if trace is not None:
            body["trace"] = trace.finish("refused")
        await self._send_report(task_id, body, journaled=False)

    async def _send_report(
        self, task_id: str, body: Mapping[str, Any], journaled: bool = True, stream: TaskOutput | None = None
    ) -> None:
        """Resend the same report until acknowledged; never re-execute. A duplicate ack counts as success.
        A report naming more output than the control plane holds sends the rest of ``stream`` first."""
        attempt = 0
        deadline = None
        while True:
            try:
                await self.client.report(dict(body))
                break
            except GatewayRefused as exc:
                acked = exc.details.get("acked")
                if exc.code == "output_incomplete" and stream is not None and isinstance(acked, int):
                    log.warning("the control plane holds less output than reported; sending the rest",
                                task_id=task_id, acked=acked)  # fmt: skip
                    try:
                        await stream.upload_again_from(acked)
                    except UploadFailed as failed:
                        log.error("output refused; report not sent", task_id=task_id, code=failed.code)
                        break
                    continue
                if exc.code not in RETRYABLE_REPORT_REFUSALS:
                    # 403/409: the control plane will never accept it; the journal keeps the evidence.
                    log.error("report refused", task_id=task_id, code=exc.code)
                    break
                # Something on the path altered or replayed the request, or the clocks disagree: the
                # same report with a fresh token may well go through. Never lose a result to that.
                delay = backoff(attempt, base=0.5, cap=self.options.max_backoff_s)
                log.warning("report refused in transit; retrying", task_id=task_id, code=exc.code,
                            seconds=round(delay, 2))  # fmt: skip
                await asyncio.sleep(delay)
                attempt += 1
            except GatewayUnavailable as exc:
                if self.stopping.is_set():
                    deadline = deadline or time.monotonic() + self.options.grace_s
                    if time.monotonic() > deadline:
                        log.warning(
                            "giving up on a report for now; it is re-sent on the next start", task_id=task_id
                        )
                        return
                delay = backoff(attempt, base=0.5, cap=self.options.max_backoff_s)
                log.warning(
                    "report not delivered; retrying",
                    task_id=task_id,
                    seconds=round(delay, 2),
                    reason=str(exc),
                )
                await asyncio.sleep(delay)
                attempt += 1
        if journaled:
            self.journal.mark_reported(task_id)
