"""gRPC adapters: TaskRouterService (platform modules) and CollectorBridgeService (the gateway).

Conversion only; the rules live in :mod:`router.dispatch.service`. The collector id in
every CollectorBridgeService request was taken by the gateway from a verified
bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from versus.router.v1 import collector_bridge_pb2 as bridge_pb
from versus.router.v1 import collector_bridge_pb2_grpc, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.access import rbac
from common.errors import InvalidArgument, NotFound
from common.grpc.pb_time import timestamp as ts
from common.grpc.server import Context
from common.protocol import check_features
from router.core.sql import Row
from router.core.states import TERMINAL, State
from router.core.wakes import task_key
from router.dispatch.cancels import CANCEL_GRACE_S
from router.dispatch.exchange import BridgeExchange
from router.dispatch.grpc_queries import QueryRpcs
from router.dispatch.pb_convert import OP_CLASS_FROM_PB, STATE_TO_PB, task_pb
from router.dispatch.service import Router
from router.dispatch.submit import Audited, SubmitRequest, retry_request
from router.output.streams import Appended
from router.releases.updates import Report

# WatchTask re-reads the task when woken; without a wake-up (Redis trouble) at least this often.
WATCH_FALLBACK_S = 2.0

VERDICT_TO_PB = {
    "continue": bridge_pb.HELD_VERDICT_CONTINUE,
    "cancel": bridge_pb.HELD_VERDICT_CANCEL,
    "terminate": bridge_pb.HELD_VERDICT_TERMINATE,
}
APPENDED_TO_PB = {
    Appended.APPENDED: bridge_pb.APPEND_OUTCOME_APPENDED,
    Appended.GAP: bridge_pb.APPEND_OUTCOME_GAP,
    Appended.OVERLAP: bridge_pb.APPEND_OUTCOME_OVERLAP,
}
OUTCOME_FROM_PB = {
    bridge_pb.REPORT_OUTCOME_RUNNING: State.RUNNING,
    bridge_pb.REPORT_OUTCOME_SUCCESS: State.SUCCESS,
    bridge_pb.REPORT_OUTCOME_FAILED: State.FAILED,
    bridge_pb.REPORT_OUTCOME_CANCELLED: State.CANCELLED,
    bridge_pb.REPORT_OUTCOME_UNKNOWN: State.UNKNOWN,
    # The collector refused the envelope, so it did not execute it.
    bridge_pb.REPORT_OUTCOME_REFUSED: State.FAILED,
}


class TaskRouterServicer(QueryRpcs, task_router_pb2_grpc.TaskRouterServiceServicer):
    def __init__(self, router: Router):
        self.router = router

    async def SubmitTask(self, request: pb.SubmitTaskRequest, context: Context) -> pb.SubmitTaskResponse:
        if not request.HasField("deadline"):
            raise InvalidArgument("deadline is required", code="deadline_missing")
        if request.tenant_id:  # a missing tenant is the validator's to refuse
            rbac.require_tenant(request.tenant_id)
        submitted = SubmitRequest(
            provider=request.provider,
            operation=request.operation,
            op_class=OP_CLASS_FROM_PB.get(request.op_class, ""),
            target_ref=request.target_ref,
            site_id=request.site_id,
            tenant_id=request.tenant_id,
            params=request.params,
            idempotency_key=request.idempotency_key,
            deadline=request.deadline.ToDatetime(tzinfo=dt.UTC),
            requires_fips=request.requires_fips,
            labels=dict(request.labels),
            features=check_features(request.features),
        )
        task, existing = await self.router.submit(submitted)
        return pb.SubmitTaskResponse(task=task_pb(task), existing=existing)

    async def _visible(self, task_id: str) -> tuple[Row, Sequence[Row]]:
        """The task and its history, if the caller's tenant scope covers it.

        Another tenant's task is answered exactly as a task that does not exist, so a scoped
        token cannot even learn which task ids are in use.
        """
        task, history = await self.router.get(task_id)
        if not rbac.sees_tenant(task["tenant_id"]):
            raise NotFound(f"task {task_id!r} does not exist", code="task_not_found")
        return task, history

    async def GetTask(self, request: pb.GetTaskRequest, context: Context) -> pb.GetTaskResponse:
        task, history = await self._visible(request.task_id)
        return pb.GetTaskResponse(task=task_pb(task, history))

    async def WatchTask(
        self, request: pb.WatchTaskRequest, context: Context
    ) -> AsyncIterator[pb.WatchTaskResponse]:
        seen: Any = None
        await self._visible(request.task_id)  # a task's tenant never changes: checking once holds
        # Woken by the commit of every transition of this task; the timeout is only a safety net.
        async with self.router.wake.listening(task_key(request.task_id)) as changed:
            while True:
                changed.clear()
                task, history = await self.router.get(request.task_id)
                marker = (task["state"], task["updated_at"], len(history))
                if marker != seen:
                    seen = marker
                    yield pb.WatchTaskResponse(task=task_pb(task, history))
                if State(task["state"]) in TERMINAL:
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WATCH_FALLBACK_S):
                        await changed.wait()

    async def ReadOutput(
        self, request: pb.ReadOutputRequest, context: Context
    ) -> AsyncIterator[pb.ReadOutputResponse]:
        await self._visible(request.task_id)
        async for chunk in self.router.read_output(request.task_id, request.offset, request.follow):
            yield pb.ReadOutputResponse(
                offset=chunk.offset, data=chunk.data, complete=chunk.complete, length=chunk.length,
                sha256=chunk.sha256,
            )  # fmt: skip

    async def CancelTask(self, request: pb.CancelTaskRequest, context: Context) -> pb.CancelTaskResponse:
        await self._visible(request.task_id)
        return pb.CancelTaskResponse(task=task_pb(await self.router.cancel(request.task_id, request.reason)))

    async def RetryTask(self, request: pb.RetryTaskRequest, context: Context) -> pb.RetryTaskResponse:
        if not request.idempotency_key:
            raise InvalidArgument("idempotency_key is required", code="idempotency_key_missing")
        task, _ = await self._visible(request.task_id)
        again = retry_request(
            task,
            request.idempotency_key,
            dt.datetime.now(dt.UTC),
            terminal_confirmed=request.terminal_confirmed,
        )
        details = {"retry_of": request.task_id, "reason": request.reason[:1000]}
        created, existing = await self.router.submit(
            again, Audited(rbac.current_actor(), "task.retry", details)
        )
        return pb.RetryTaskResponse(task=task_pb(created), existing=existing)

    async def ResolveIndeterminate(
        self, request: pb.ResolveIndeterminateRequest, context: Context
    ) -> pb.ResolveIndeterminateResponse:
        outcome = {pb.RESOLUTION_SUCCESS: State.SUCCESS, pb.RESOLUTION_FAILED: State.FAILED}.get(
            request.resolution
        )
        if outcome is None:
            raise InvalidArgument(
                "resolution must be RESOLUTION_SUCCESS or RESOLUTION_FAILED", code="resolution_invalid"
            )
        task = await self.router.resolve(request.task_id, outcome, request.note, rbac.current_actor())
        return pb.ResolveIndeterminateResponse(task=task_pb(task))


def manifest_from_pb(providers: Sequence[bridge_pb.ProviderCapability]) -> Mapping[str, Any]:
    """The stored manifest; refuses incomplete entries rather than guessing."""
    out: dict[str, Any] = {}
    for p in providers:
        if not p.provider or p.max_concurrency == 0:
            raise InvalidArgument(
                "every provider needs a name and max_concurrency >= 1", code="manifest_invalid"
            )
        ops = []
        for op in p.operations:
            if not op.name or op.op_class not in OP_CLASS_FROM_PB:
                raise InvalidArgument("every operation needs a name and an op_class", code="manifest_invalid")
            ops.append(
                {
                    "name": op.name,
                    "op_class": OP_CLASS_FROM_PB[op.op_class],
                    "parallel_safe": op.parallel_safe,
                    "reconcile_operation": op.reconcile_operation,
                    "timeout_s": op.timeout.seconds,
                }
            )
        out[p.provider] = {"max_concurrency": p.max_concurrency, "operations": ops}
    return {"providers": out}


class CollectorBridgeServicer(collector_bridge_pb2_grpc.CollectorBridgeServiceServicer):
    def __init__(self, router: Router):
        self.router = router
        self.exchange = BridgeExchange(self)

    def begin_shutdown(self) -> None:
        """The process is stopping: gateways' streams are told to move their new calls."""
        self.exchange.begin_shutdown()

    def Exchange(
        self, request_iterator: AsyncIterator[bridge_pb.ExchangeRequest], context: Context
    ) -> AsyncIterator[bridge_pb.ExchangeResponse]:
        return self.exchange.serve(request_iterator)

    async def Claim(self, request: bridge_pb.ClaimRequest, context: Context) -> bridge_pb.ClaimResponse:
        if not request.collector_id:
            raise InvalidArgument("collector_id is required", code="collector_id_missing")
        wait = request.wait.seconds + request.wait.nanos / 1e9
        if request.HasField("update_status") and self.router.updates is not None:
            # Before the claim waits: a rollback is recorded (and audited) when it is reported.
            u = request.update_status
            await self.router.updates.record(request.collector_id, Report(u.state, u.version, u.detail, u.at))
        answer = await self.router.claim_with_offers(
            request.collector_id,
            claim_seq=request.claim_seq,
            held_task_ids=frozenset(request.held_task_ids),
            wait_s=wait,
            draining=request.draining,
            agent_version=request.agent_version,
            session_id=request.session_id,
            transport=request.transport,
            vault_mode=request.vault_mode,
            config_version=request.config_version,
            key_versions=dict(request.key_versions),
            max_dispatches=request.max_dispatches,
            free_slots=dict(request.free_slots),
            protocol_version=request.protocol_version or 1,
            resume=request.resume,
        )
        claimed, offers, restart = answer.claimed, answer.offers, answer.restart
        now = ts(dt.datetime.now(dt.UTC))
        reply = bridge_pb.ClaimResponse(
            server_time=now,
            offers=[
                bridge_pb.Offer(type=str(o["type"]), session_id=str(o["session_id"]), host=str(o["host"]),
                                port=int(o["port"]), signed_json=json.dumps(o["signed"]))
                for o in offers
            ],
        )  # fmt: skip
        if restart is not None:
            reply.config_json = json.dumps(restart)
        for dispatch_id, said in answer.verdicts.items():
            reply.verdicts[dispatch_id] = VERDICT_TO_PB[said]
        if answer.verdicts:
            reply.cancel_grace_seconds = CANCEL_GRACE_S
        for r in answer.revokes:
            reply.revokes.add(
                revocation_id=r["revocation_id"], credential_ref=r["credential_ref"], action=r["action"],
                dispatch_ids=list(r["dispatch_ids"]),
            )  # fmt: skip
        if request.key_versions and self.router.key_chains is not None:
            steps = self.router.key_chains.behind(dict(request.key_versions))
            if steps:
                reply.key_sets_json = json.dumps(steps)
        if request.key_versions and not reply.key_sets_json and self.router.trust is not None:
            bundle = await self.router.trust.document(request.collector_id, dict(request.key_versions))
            if bundle is not None:
                reply.trust_json = json.dumps(bundle)
        for c in claimed:
            if c.credential:
                reply.credentials_json[c.dispatch_id] = c.credential
        if claimed:
            first, *more = claimed
            reply.envelope.envelope_json = first.envelope
            reply.dispatch_id = first.dispatch_id
            reply.traceparent = first.traceparent
            for c in more:
                reply.more.add(
                    dispatch_id=c.dispatch_id, traceparent=c.traceparent
                ).envelope.envelope_json = c.envelope
        return reply

    async def Report(self, request: bridge_pb.ReportRequest, context: Context) -> bridge_pb.ReportResponse:
        outcome = OUTCOME_FROM_PB.get(request.outcome)
        if outcome is None:
            raise InvalidArgument("outcome is required", code="outcome_invalid")
        result = await self.router.report(
            request.collector_id,
            request.task_id,
            outcome,
            request.result,
            request.error_code,
            request.error_message,
            refused=request.outcome == bridge_pb.REPORT_OUTCOME_REFUSED,
            signature=request.signature,
            output=(request.output.length, request.output.sha256) if request.HasField("output") else None,
        )
        return bridge_pb.ReportResponse(duplicate=result.duplicate, state=STATE_TO_PB[result.state])

    async def PublishCapabilities(
        self, request: bridge_pb.PublishCapabilitiesRequest, context: Context
    ) -> bridge_pb.PublishCapabilitiesResponse:
        manifest = manifest_from_pb(request.providers)
        epoch = await self.router.publish_capabilities(
            request.collector_id, request.capability_epoch, manifest, request.fips, request.agent_version
        )
        return bridge_pb.PublishCapabilitiesResponse(capability_epoch=epoch)

    async def AppendOutput(
        self, request: bridge_pb.AppendOutputRequest, context: Context
    ) -> bridge_pb.AppendOutputResponse:
        if not request.collector_id:
            raise InvalidArgument("collector_id is required", code="collector_id_missing")
        outcome, acked = await self.router.append_output(
            request.collector_id, request.dispatch_id, request.offset, request.data
        )
        return bridge_pb.AppendOutputResponse(outcome=APPENDED_TO_PB[outcome], acked=acked)

    async def AckRevocation(
        self, request: bridge_pb.AckRevocationRequest, context: Context
    ) -> bridge_pb.AckRevocationResponse:
        if not request.collector_id:
            raise InvalidArgument("collector_id is required", code="collector_id_missing")
        recorded = await self.router.ack_revocation(
            request.collector_id, request.revocation_id, dict(request.results)
        )
        return bridge_pb.AckRevocationResponse(recorded=recorded)

    async def Goodbye(self, request: bridge_pb.GoodbyeRequest, context: Context) -> bridge_pb.GoodbyeResponse:
        if not request.collector_id:
            raise InvalidArgument("collector_id is required", code="collector_id_missing")
        requeued, current = await self.router.collector_said_goodbye(
            request.collector_id, request.session_id, request.reason
        )
        return bridge_pb.GoodbyeResponse(requeued=requeued, current=current)
