"""The collector control channel over per-call HTTPS: claim, report, capabilities.

    POST /api/collector/v1/claim         long-poll for the next task (200 with a task, or 204)
    POST /api/collector/v1/report        the result of one task
    POST /api/collector/v1/capabilities  the driver manifest
    POST /api/collector/v1/bye           a clean shutdown (protocol 2)

Every call needs a bearer token of an active collector; the collector id is
taken from the verified token and nothing else. Each call is translated into a
CollectorBridgeService RPC on the router. Every message says which protocol
version it is written in (the ``X-Versus-Protocol`` header, or the WSS frame's
``v``) and each claim settles the version with the collector (common/protocol.py).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import json
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response
from google.protobuf.duration_pb2 import Duration
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import task_pb2

from common import protocol
from common.errors import InvalidArgument
from common.telemetry import tracing
from gateway import traces
from gateway.auth import authenticate, check_body
from gateway.body import read_json_body
from gateway.claims import claim_op
from gateway.collector_bodies import (
    ByeBody,
    CapabilitiesBody,
    CapabilitiesOut,
    ReportBody,
    ReportOut,
    RevokedBody,
)
from gateway.control_call import ControlCall, ControlReply
from gateway.enroll_api import parse_body
from gateway.metrics import REPORT_OUTCOMES

router = APIRouter(prefix="/api/collector/v1", tags=["collector"])

# Limits (docs/gateway.md).
MAX_CLAIM_BODY = 64 * 1024
MAX_REPORT_BODY = 2 * 1024 * 1024
MAX_CAPABILITIES_BODY = 256 * 1024
MAX_BYE_BODY = 4 * 1024
MAX_REVOKED_BODY = 256 * 1024
_OUTCOMES = {
    "running": bpb.REPORT_OUTCOME_RUNNING,
    "success": bpb.REPORT_OUTCOME_SUCCESS,
    "failed": bpb.REPORT_OUTCOME_FAILED,
    "unknown": bpb.REPORT_OUTCOME_UNKNOWN,
    "refused": bpb.REPORT_OUTCOME_REFUSED,
    "cancelled": bpb.REPORT_OUTCOME_CANCELLED,
}
_OP_CLASSES = {
    "read": task_pb2.OP_CLASS_READ,
    "mutate_reconcilable": task_pb2.OP_CLASS_MUTATE_RECONCILABLE,
    "mutate_terminal": task_pb2.OP_CLASS_MUTATE_TERMINAL,
}


_TASK_DOC = (
    "A task: dispatch_id, envelope (the signed wire JSON, docs/envelope.md), server_time, server_time_ms, "
    "held_ms, hold_s and offers (tunnel offers, each with its signed document); or offers alone; or config "
    "(a newer signed collector config, docs/day2.md) and no task"
)


async def report_op(msg: ControlCall) -> ControlReply:
    """Record the result of one task dispatched to this collector."""
    body = parse_body(ReportBody, msg.raw)
    body.check_version(msg.version)
    try:
        result = binascii.a2b_base64(body.result_b64, strict_mode=True)
    except ValueError:  # binascii.Error, or text that is not ASCII at all
        raise InvalidArgument("result_b64 is not valid base64", code="invalid_body") from None
    trace = traces.report_trace(body.trace)
    if trace is None:
        return await _report(msg, body, result)
    attributes = {"versus.collector_id": msg.collector_id, "versus.dispatch_id": body.task_id,
                  "versus.reported": body.outcome}  # fmt: skip
    with tracing.span(
        "versus.gateway.report", parent=trace.traceparent, kind="server", attributes=attributes
    ):
        traces.export_collector_spans(trace, msg.collector_id)
        return await _report(msg, body, result)


async def _report(msg: ControlCall, body: ReportBody, result: bytes) -> ControlReply:
    reply = await msg.state.backends.bridge_call(
        "report",
        bpb.ReportRequest(
            collector_id=msg.collector_id,
            task_id=body.task_id,
            outcome=_OUTCOMES[body.outcome],
            result=result,
            error_code=body.error_code,
            error_message=body.error_message,
            signature=body.signature,
            output=bpb.OutputDigest(length=body.output.length, sha256=body.output.sha256.lower())
            if body.output
            else None,
        ),
        msg.request_id,
    )
    REPORT_OUTCOMES.labels(body.outcome).inc()
    task_state = task_pb2.TaskState.Name(reply.state).removeprefix("TASK_STATE_").lower()
    return ControlReply(
        200, ReportOut(duplicate=reply.duplicate, state=task_state).model_dump_json().encode()
    )


async def capabilities_op(msg: ControlCall) -> ControlReply:
    """Store the driver manifest and have queued work re-evaluated against it."""
    body = parse_body(CapabilitiesBody, msg.raw)
    names = [p.provider for p in body.providers]
    if len(names) != len(set(names)):
        raise InvalidArgument("each provider may appear once", code="invalid_body")
    reply = await msg.state.backends.bridge_call(
        "publish_capabilities",
        bpb.PublishCapabilitiesRequest(
            collector_id=msg.collector_id,
            capability_epoch=body.capability_epoch,
            fips=body.fips,
            agent_version=body.agent_version,
            providers=[
                bpb.ProviderCapability(
                    provider=p.provider,
                    max_concurrency=p.max_concurrency,
                    operations=[
                        bpb.OperationCapability(
                            name=o.name,
                            op_class=_OP_CLASSES[o.op_class],
                            timeout=Duration(seconds=o.timeout_s),
                            parallel_safe=o.parallel_safe,
                            reconcile_operation=o.reconcile_operation,
                        )
                        for o in p.operations
                    ],
                )
                for p in body.providers
            ],
        ),
        msg.request_id,
    )
    accepted = reply.capability_epoch == body.capability_epoch
    return ControlReply(
        200,
        CapabilitiesOut(capability_epoch=reply.capability_epoch, accepted=accepted)
        .model_dump_json()
        .encode(),
    )


async def bye_op(msg: ControlCall) -> ControlReply:
    """The collector's session is shutting down cleanly: offline from now, not lost (protocol 2)."""
    if msg.version < 2:
        raise protocol.VersionUnsupported("bye is a protocol 2 message; this one is written in version 1")
    body = parse_body(ByeBody, msg.raw)
    reply = await msg.state.backends.bridge_call(
        "goodbye",
        bpb.GoodbyeRequest(collector_id=msg.collector_id, session_id=body.session_id, reason=body.reason),
        msg.request_id,
    )
    out = {"current": reply.current, "requeued": reply.requeued}
    return ControlReply(200, json.dumps(out, separators=(",", ":")).encode())


async def revoked_op(msg: ControlCall) -> ControlReply:
    """What the collector scrubbed for a credential revocation (protocol 5)."""
    RevokedBody.check_version(msg.version)
    body = parse_body(RevokedBody, msg.raw)
    reply = await msg.state.backends.bridge_call(
        "ack_revocation",
        bpb.AckRevocationRequest(
            collector_id=msg.collector_id, revocation_id=body.revocation_id, results=body.results
        ),
        msg.request_id,
    )
    return ControlReply(200, json.dumps({"recorded": reply.recorded}).encode())


Operation = Callable[[ControlCall], Awaitable[ControlReply]]

# Frame type -> (operation, body limit): the one table both transports dispatch through.
OPERATIONS: dict[str, tuple[Operation, int]] = {
    "claim": (claim_op, MAX_CLAIM_BODY),
    "report": (report_op, MAX_REPORT_BODY),
    "capabilities": (capabilities_op, MAX_CAPABILITIES_BODY),
    "bye": (bye_op, MAX_BYE_BODY),
    "revoked": (revoked_op, MAX_REVOKED_BODY),
}


# Logged and counted for a held claim whose collector hung up (nginx's "client closed request").
CLIENT_GONE = 499


async def _client_gone(request: Request) -> None:
    """Return once the client disconnects (the body has been read, so nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Request, work: Awaitable[ControlReply]) -> ControlReply:
    """Run ``work``, cancelling it if the client disconnects first.

    A held claim whose collector hung up would otherwise stay parked in the router until the
    hold ends and could be handed a task nobody will read (recovered only by the collector's
    next numbered claim). Cancelling the call ends the router's wait at once.
    """
    call = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not call.done():
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        return ControlReply(CLIENT_GONE)
    return call.result()


async def _http(request: Request, name: str) -> Response:
    version = protocol.header_version(request.headers.get(protocol.HEADER))
    claims, _ = await authenticate(request, request.app.state.store, body_follows=True)
    operation, limit = OPERATIONS[name]
    raw = await read_json_body(request, limit)
    check_body(claims, raw)
    call = ControlCall(
        request.app.state, claims.collector_id, raw, request.state.request_id, "https", version
    )
    work = operation(call)
    reply = await (_unless_client_leaves(request, work) if name == "claim" else work)
    media_type = "application/json" if reply.payload else None
    # Every answer says which version it is written in: the request's own (a claim's, the settled one).
    headers = {protocol.HEADER: str(version), **reply.headers}
    return Response(reply.payload, status_code=reply.status, headers=headers, media_type=media_type)


@router.post(
    "/claim",
    responses={
        200: {"description": _TASK_DOC},
        204: {
            "description": "No task within the hold; headers X-Versus-Server-Time, X-Versus-Server-Time-Ms, "
            "X-Versus-Held-Ms and X-Versus-Claim-Hold"
        },
    },
)
async def claim(request: Request) -> Response:
    """Long-poll for the next task. Doubles as the collector's heartbeat (there is no other)."""
    return await _http(request, "claim")


@router.post("/report", response_model=ReportOut)
async def report(request: Request) -> Response:
    """The result of one task that was dispatched to this collector."""
    return await _http(request, "report")


@router.post("/capabilities", response_model=CapabilitiesOut)
async def capabilities(request: Request) -> Response:
    """Publish the driver manifest; queued work is re-evaluated against it at once."""
    return await _http(request, "capabilities")


@router.post("/revoked")
async def revoked(request: Request) -> Response:
    """What this collector scrubbed for a credential revocation its claim carried (protocol 5), per
    dispatch: `{"recorded": true}` once the control plane has it."""
    return await _http(request, "revoked")


@router.post("/bye")
async def bye(request: Request) -> Response:
    """A clean shutdown of the collector's session (protocol 2; the request says ``X-Versus-Protocol: 2``):
    it is offline, not lost, and work leased to it and not yet handed out is placed again at once."""
    return await _http(request, "bye")
