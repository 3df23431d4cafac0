"""The collector control channel over per-call HTTPS: claim, report, capabilities.

    POST /api/collector/v1/claim         long-poll for the next task (200 with a task, or 204)
    POST /api/collector/v1/report        the result of one task
    POST /api/collector/v1/capabilities  the driver manifest

Every call needs a bearer token of an active collector; the collector id is
taken from the verified token and nothing else. Each call is translated into a
CollectorBridgeService RPC on the router.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from google.protobuf.duration_pb2 import Duration
from pydantic import BaseModel, Field
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import task_pb2

from common.errors import InvalidArgument
from common.limits import MAX_CLAIM_BATCH
from gateway.auth import authenticate, check_body
from gateway.body import read_json_body
from gateway.body_fields import FreeText, Int64, Name
from gateway.clients import CALL_TIMEOUT_S, call
from gateway.enroll_api import parse_body
from gateway.metrics import CLAIM_OUTCOMES, CLAIMS_HELD, REPORT_OUTCOMES

router = APIRouter(prefix="/api/collector/v1", tags=["collector"])

# Limits (docs/gateway.md).
MAX_CLAIM_BODY = 64 * 1024
MAX_HELD_TASK_IDS = 1000
MAX_RESULT_BYTES = 1024 * 1024
MAX_REPORT_BODY = 2 * 1024 * 1024
MAX_CAPABILITIES_BODY = 256 * 1024
MAX_ERROR_MESSAGE = 4096
MAX_CONCURRENCY = 1024  # per provider; a claim's free slots cannot exceed it either

_ID = Field(min_length=1, max_length=128)
_OUTCOMES = {
    "running": bpb.REPORT_OUTCOME_RUNNING,
    "success": bpb.REPORT_OUTCOME_SUCCESS,
    "failed": bpb.REPORT_OUTCOME_FAILED,
    "unknown": bpb.REPORT_OUTCOME_UNKNOWN,
    "refused": bpb.REPORT_OUTCOME_REFUSED,
}
_OP_CLASSES = {
    "read": task_pb2.OP_CLASS_READ,
    "mutate_reconcilable": task_pb2.OP_CLASS_MUTATE_RECONCILABLE,
    "mutate_terminal": task_pb2.OP_CLASS_MUTATE_TERMINAL,
}


# Year 2100: any later "when" is a broken clock, refused rather than stored.
MAX_REPORT_TIME_S = 4_102_444_800


class UpdateStatusBody(BaseModel):
    """What the collector's supervisor last recorded about an upgrade (docs/upgrades.md)."""

    state: Literal["updating", "updated", "rolled_back", "failed"]
    version: Name = Field(max_length=64)
    detail: FreeText = Field(default="", max_length=500)
    at: int = Field(
        default=0, ge=0, le=MAX_REPORT_TIME_S, description="when, Unix seconds on the collector's clock"
    )


def _update_status(body: UpdateStatusBody | None) -> bpb.UpdateStatus | None:
    if body is None:
        return None
    return bpb.UpdateStatus(state=body.state, version=body.version, detail=body.detail, at=body.at)


class ClaimBody(BaseModel):
    claim_seq: Int64 = Field(default=0, description="1, 2, 3, ... for sequential claims; 0 = unnumbered")
    held_task_ids: list[Name] = Field(default_factory=list, max_length=MAX_HELD_TASK_IDS)
    capacity: dict[Name, Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)]] = Field(
        default_factory=dict, max_length=64, description="free slots per provider"
    )
    draining: bool = False
    agent_version: Name = Field(default="", max_length=64)
    wait_s: float | None = Field(default=None, ge=0, description="ask for a shorter hold than the server's")
    session_id: str = Field(
        default="",
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]*$",
        description="random id chosen at process start; a newer session supersedes an older one",
    )
    vault_mode: Literal["", "local", "relayed", "external"] = Field(
        default="", description="vault mode the running process applies"
    )
    config_version: Int64 = Field(
        default=0, ge=0, description="version of the signed config the collector runs (0: none yet)"
    )
    key_versions: dict[Literal["dispatch", "release", "trust"], Annotated[int, Field(ge=0, le=2**63 - 1)]] = (
        Field(
            default_factory=dict,
            description="versions of the key sets and of the trust bundle the collector holds; when the "
            "control plane has newer ones the answer carries the rotation steps (key_sets) or the signed "
            "bundle (trust) and no task",
        )
    )
    max_tasks: int = Field(
        default=1,
        ge=1,
        le=MAX_CLAIM_BATCH,
        description="most tasks one answer may carry; tasks after the first are in `more`",
    )
    update_status: UpdateStatusBody | None = Field(
        default=None, description="the supervisor's last upgrade report, until it is superseded"
    )


class ReportBody(BaseModel):
    task_id: Name = _ID
    outcome: Literal["running", "success", "failed", "unknown", "refused"]
    result_b64: str = Field(default="", max_length=(MAX_RESULT_BYTES + 2) // 3 * 4)
    error_code: Name = Field(default="", max_length=128)
    error_message: FreeText = Field(default="", max_length=MAX_ERROR_MESSAGE)
    signature: str = Field(
        default="",
        max_length=2048,
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="the collector's ES256 signature over what this report says (docs/threat-model.md); "
        "required: a report without one is refused with report_unsigned",
    )


class ReportOut(BaseModel):
    duplicate: bool
    state: str


class OperationIn(BaseModel):
    name: Name = _ID
    op_class: Literal["read", "mutate_reconcilable", "mutate_terminal"]
    timeout_s: int = Field(default=60, ge=1, le=86_400)
    parallel_safe: bool = False
    reconcile_operation: Name = Field(default="", max_length=128)


class ProviderIn(BaseModel):
    provider: Name = _ID
    max_concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)
    operations: list[OperationIn] = Field(max_length=256)


class CapabilitiesBody(BaseModel):
    capability_epoch: Int64
    fips: bool = False
    agent_version: Name = Field(default="", max_length=64)
    providers: list[ProviderIn] = Field(max_length=64)


class CapabilitiesOut(BaseModel):
    capability_epoch: int
    accepted: bool


_TASK_DOC = (
    "A task: dispatch_id, envelope (the signed wire JSON, docs/envelope.md), server_time, server_time_ms, "
    "held_ms, hold_s and offers (tunnel offers, each with its signed document); or offers alone; or config "
    "(a newer signed collector config, docs/day2.md) and no task"
)


def _server_time() -> tuple[str, int]:
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), int(now.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class ControlReply:
    """One answer on the control channel, the same over per-call HTTPS and over the WebSocket."""

    status: int
    payload: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


async def claim_op(
    state: Any, collector_id: str, raw: bytes, request_id: str | None, transport: str = "https"
) -> ControlReply:
    """Refresh liveness and wait (up to the hold) for a dispatch leased to this collector."""
    started = time.monotonic()
    body = parse_body(ClaimBody, raw)
    if any(len(t) > 128 for t in body.held_task_ids):
        raise InvalidArgument("held_task_ids entries are at most 128 characters", code="invalid_body")
    max_hold: float = state.claim_hold_s
    hold = max_hold if body.wait_s is None else min(body.wait_s, max_hold)
    seconds = int(hold)
    CLAIMS_HELD.inc()
    try:
        reply = await call(
            state.backends.bridge.Claim,
            bpb.ClaimRequest(
                collector_id=collector_id,
                free_slots={k: max(v, 0) for k, v in body.capacity.items()},
                draining=body.draining,
                agent_version=body.agent_version,
                wait=Duration(seconds=seconds, nanos=int((hold - seconds) * 1e9)),
                claim_seq=body.claim_seq,
                held_task_ids=body.held_task_ids,
                session_id=body.session_id,
                transport=transport,
                vault_mode=body.vault_mode,
                config_version=body.config_version,
                key_versions={str(k): v for k, v in body.key_versions.items()},
                max_dispatches=body.max_tasks,
                update_status=_update_status(body.update_status),
            ),
            request_id,
            timeout_s=hold + CALL_TIMEOUT_S,
        )
    finally:
        CLAIMS_HELD.dec()
    stamp, stamp_ms = _server_time()
    # How long the claim was held here: the collector subtracts it from its round trip, so a
    # long-poll still gives it a precise clock offset (common/envelope/fence.py RoundTrip).
    held_ms = int((time.monotonic() - started) * 1000)
    # Offers and config are signed documents (common/signed_doc.py): passed on, never trusted here.
    offers = [
        {"type": o.type, "session_id": o.session_id, "host": o.host, "port": o.port,
         "signed": json.loads(o.signed_json)}
        for o in reply.offers
    ]  # fmt: skip
    # Instead of work: key set rotation steps the collector is behind on (it walks them first), a
    # newer signed config it applies, or a newer signed trust bundle (docs/day2.md).
    answers = (("key_sets", reply.key_sets_json), ("config", reply.config_json), ("trust", reply.trust_json))
    for name, document in answers:
        if document:
            CLAIM_OUTCOMES.labels(name).inc()
            body_out = {
                "server_time": stamp, "server_time_ms": stamp_ms, "held_ms": held_ms, "offers": [],
                name: json.loads(document),
            }  # fmt: skip
            return ControlReply(200, json.dumps(body_out, separators=(",", ":")).encode())
    if not reply.HasField("envelope") and not offers:
        CLAIM_OUTCOMES.labels("empty").inc()
        return ControlReply(
            204,
            headers={
                "X-Versus-Server-Time": stamp,
                "X-Versus-Server-Time-Ms": str(stamp_ms),
                "X-Versus-Held-Ms": str(held_ms),
                "X-Versus-Claim-Hold": f"{max_hold:g}",
            },
        )
    CLAIM_OUTCOMES.labels("task" if reply.HasField("envelope") else "offers").inc()
    fields: dict[str, Any] = {
        "server_time": stamp,
        "server_time_ms": stamp_ms,
        "held_ms": held_ms,
        "hold_s": max_hold,
        "offers": offers,
    }
    if not reply.HasField("envelope"):
        return ControlReply(200, json.dumps(fields, separators=(",", ":")).encode())
    # Envelopes are embedded byte for byte: the gateway never re-serialises signed material.
    head = json.dumps({"dispatch_id": reply.dispatch_id, **fields}, separators=(",", ":"))
    payload = head[:-1].encode() + b',"envelope":' + reply.envelope.envelope_json
    if reply.more:
        items = (
            b'{"dispatch_id":'
            + json.dumps(m.dispatch_id).encode()
            + b',"envelope":'
            + m.envelope.envelope_json
            + b"}"
            for m in reply.more
        )
        payload += b',"more":[' + b",".join(items) + b"]"
    return ControlReply(200, payload + b"}")


async def report_op(
    state: Any, collector_id: str, raw: bytes, request_id: str | None, transport: str = "https"
) -> ControlReply:
    """Record the result of one task dispatched to this collector."""
    body = parse_body(ReportBody, raw)
    try:
        result = binascii.a2b_base64(body.result_b64, strict_mode=True)
    except ValueError:  # binascii.Error, or text that is not ASCII at all
        raise InvalidArgument("result_b64 is not valid base64", code="invalid_body") from None
    reply = await call(
        state.backends.bridge.Report,
        bpb.ReportRequest(
            collector_id=collector_id,
            task_id=body.task_id,
            outcome=_OUTCOMES[body.outcome],
            result=result,
            error_code=body.error_code,
            error_message=body.error_message,
            signature=body.signature,
        ),
        request_id,
    )
    REPORT_OUTCOMES.labels(body.outcome).inc()
    task_state = task_pb2.TaskState.Name(reply.state).removeprefix("TASK_STATE_").lower()
    return ControlReply(
        200, ReportOut(duplicate=reply.duplicate, state=task_state).model_dump_json().encode()
    )


async def capabilities_op(
    state: Any, collector_id: str, raw: bytes, request_id: str | None, transport: str = "https"
) -> ControlReply:
    """Store the driver manifest and have queued work re-evaluated against it."""
    body = parse_body(CapabilitiesBody, raw)
    names = [p.provider for p in body.providers]
    if len(names) != len(set(names)):
        raise InvalidArgument("each provider may appear once", code="invalid_body")
    reply = await call(
        state.backends.bridge.PublishCapabilities,
        bpb.PublishCapabilitiesRequest(
            collector_id=collector_id,
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
        request_id,
    )
    accepted = reply.capability_epoch == body.capability_epoch
    return ControlReply(
        200,
        CapabilitiesOut(capability_epoch=reply.capability_epoch, accepted=accepted)
        .model_dump_json()
        .encode(),
    )


Operation = Callable[[Any, str, bytes, "str | None", str], Awaitable[ControlReply]]

# Frame type -> (operation, body limit): the one table both transports dispatch through.
OPERATIONS: dict[str, tuple[Operation, int]] = {
    "claim": (claim_op, MAX_CLAIM_BODY),
    "report": (report_op, MAX_REPORT_BODY),
    "capabilities": (capabilities_op, MAX_CAPABILITIES_BODY),
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
    claims, _ = await authenticate(request, request.app.state.store, body_follows=True)
    operation, limit = OPERATIONS[name]
    raw = await read_json_body(request, limit)
    check_body(claims, raw)
    work = operation(request.app.state, claims.collector_id, raw, request.state.request_id, "https")
    reply = await (_unless_client_leaves(request, work) if name == "claim" else work)
    media_type = "application/json" if reply.payload else None
    return Response(reply.payload, status_code=reply.status, headers=reply.headers, media_type=media_type)


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
