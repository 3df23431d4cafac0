"""The claim operation: park it here or take it to the router, and write the answer.

A claim either waits out its hold in this gateway (gateway/parking/: nothing is announced for
the collector and it says nothing new) and is answered 204 here, or goes to the router's
``Claim`` with what is left of its hold, as every claim did before parking. Both answers are
written the same way: the router's reply is turned into the collector's JSON here, signed
material embedded byte for byte.
"""

from __future__ import annotations

import json
import time
from typing import Any

from google.protobuf.duration_pb2 import Duration
from versus.router.v1 import collector_bridge_pb2 as bpb

from common import protocol
from common.errors import InvalidArgument
from gateway import traces
from gateway.clients import CALL_TIMEOUT_S
from gateway.collector_bodies import ClaimBody, UpdateStatusBody
from gateway.control_call import ControlCall, ControlReply, server_time
from gateway.enroll_api import parse_body
from gateway.metrics import CLAIM_OUTCOMES, CLAIMS_HELD
from gateway.parking.beats import Beat
from gateway.parking.hub import ClaimParking, news_of

_VERDICTS = {
    bpb.HELD_VERDICT_CONTINUE: "continue",
    bpb.HELD_VERDICT_CANCEL: "cancel",
    bpb.HELD_VERDICT_TERMINATE: "terminate",
}


def _update_status(body: UpdateStatusBody | None) -> bpb.UpdateStatus | None:
    if body is None:
        return None
    return bpb.UpdateStatus(state=body.state, version=body.version, detail=body.detail, at=body.at)


async def claim_op(msg: ControlCall) -> ControlReply:
    """Refresh liveness and wait (up to the hold) for a dispatch leased to this collector."""
    started = time.monotonic()
    arrived = time.time()
    body = parse_body(ClaimBody, msg.raw)
    # The version the collector writes its next messages in: the highest both sides speak.
    settled = protocol.negotiate(body.offer())
    if any(len(t) > 128 for t in body.held_task_ids):
        raise InvalidArgument("held_task_ids entries are at most 128 characters", code="invalid_body")
    # On the control socket the socket is the heartbeat (its pings), so a claim may wait longer
    # there than a long-poll, which must end before proxies' idle timeouts.
    max_hold: float = msg.state.socket_claim_hold_s if msg.transport == "wss" else msg.state.claim_hold_s
    hold = max_hold if body.wait_s is None else min(body.wait_s, max_hold)
    parking: ClaimParking = msg.state.parking
    news = news_of(body, msg.transport, settled)
    CLAIMS_HELD.inc()
    try:
        async with parking.claim(msg.collector_id, news, resume=body.resume, hold_s=hold) as parked:
            if parked.forward is None:
                beat = Beat(body.session_id, body.claim_seq, arrived)
                if not await parking.park(parked, msg.collector_id, beat, hold, msg.heard_at):
                    CLAIM_OUTCOMES.labels("empty").inc()
                    return _empty(max_hold, settled, started)
            parking.forwarding(parked)
            remaining = max(hold - (time.monotonic() - started), 0.0)
            reply = await _forward(msg, body, settled, remaining)
            answer = _answer(reply, max_hold, settled, started, msg.collector_id, msg.transport)
            parking.answered(parked, news, empty=answer.status == 204)
            return answer
    finally:
        CLAIMS_HELD.dec()


async def _forward(msg: ControlCall, body: ClaimBody, settled: int, wait_s: float) -> Any:
    seconds = int(wait_s)
    return await msg.state.backends.bridge_call(
        "claim",
        bpb.ClaimRequest(
            collector_id=msg.collector_id,
            free_slots={k: max(v, 0) for k, v in body.capacity.items()},
            draining=body.draining,
            agent_version=body.agent_version,
            wait=Duration(seconds=seconds, nanos=int((wait_s - seconds) * 1e9)),
            claim_seq=body.claim_seq,
            held_task_ids=body.held_task_ids,
            session_id=body.session_id,
            transport=msg.transport,
            vault_mode=body.vault_mode,
            config_version=body.config_version,
            key_versions={str(k): v for k, v in body.key_versions.items()},
            max_dispatches=body.max_tasks,
            update_status=_update_status(body.update_status),
            protocol_version=settled,
            resume=body.resume,
        ),
        msg.request_id,
        timeout_s=wait_s + CALL_TIMEOUT_S,
    )


def _empty(max_hold: float, settled: int, started: float) -> ControlReply:
    stamp, stamp_ms = server_time()
    return ControlReply(
        204,
        headers={
            "X-Versus-Server-Time": stamp,
            "X-Versus-Server-Time-Ms": str(stamp_ms),
            # How long the claim was held here: the collector subtracts it from its round trip, so
            # a long-poll still gives it a precise clock offset (common/envelope/fence.py RoundTrip).
            "X-Versus-Held-Ms": str(int((time.monotonic() - started) * 1000)),
            "X-Versus-Claim-Hold": f"{max_hold:g}",
            protocol.HEADER: str(settled),
        },
    )


def _traceparent_member(value: str) -> bytes:
    return b',"traceparent":' + json.dumps(value).encode() if value else b""


def _answer(
    reply: Any, max_hold: float, settled: int, started: float, collector_id: str, transport: str
) -> ControlReply:
    """The router's ``ClaimResponse`` as the collector reads it."""
    # Offers and config are signed documents (common/trust/signed_doc.py): passed on, never trusted here.
    offers = [
        {"type": o.type, "session_id": o.session_id, "host": o.host, "port": o.port,
         "signed": json.loads(o.signed_json)}
        for o in reply.offers
    ]  # fmt: skip
    # Instead of work: key set rotation steps the collector is behind on (it walks them first), a
    # newer signed config it applies, or a newer signed trust bundle (docs/day2.md).
    # Protocol 3: what to do with tasks the collector holds (docs/protocol.md, cancel and resume);
    # protocol 5: credentials to take back from them.
    verdicts: dict[str, Any] = {}
    if reply.verdicts:
        verdicts = {
            "verdicts": {d: _VERDICTS[v] for d, v in sorted(reply.verdicts.items()) if v in _VERDICTS},
            "cancel_grace_s": reply.cancel_grace_seconds,
        }
    if reply.credentials_json:
        # Vault mode B: signed documents, passed on as they are (the collector verifies them).
        verdicts["credentials"] = {d: json.loads(doc) for d, doc in sorted(reply.credentials_json.items())}
    if reply.revokes:
        verdicts["revokes"] = [
            {"revocation_id": r.revocation_id, "credential_ref": r.credential_ref, "action": r.action,
             "dispatch_ids": list(r.dispatch_ids)}
            for r in reply.revokes
        ]  # fmt: skip
    stamp, stamp_ms = server_time()
    held_ms = int((time.monotonic() - started) * 1000)
    answers = (("key_sets", reply.key_sets_json), ("config", reply.config_json), ("trust", reply.trust_json))
    for name, document in answers:
        if document:
            CLAIM_OUTCOMES.labels(name).inc()
            body_out = {
                "server_time": stamp, "server_time_ms": stamp_ms, "held_ms": held_ms, "protocol": settled,
                "offers": [], **verdicts, name: json.loads(document),
            }  # fmt: skip
            return ControlReply(200, json.dumps(body_out, separators=(",", ":")).encode())
    if not reply.HasField("envelope") and not offers and not verdicts:
        CLAIM_OUTCOMES.labels("empty").inc()
        return _empty(max_hold, settled, started)
    CLAIM_OUTCOMES.labels("task" if reply.HasField("envelope") else "offers" if offers else "verdicts").inc()
    fields: dict[str, Any] = {
        "server_time": stamp,
        "server_time_ms": stamp_ms,
        "held_ms": held_ms,
        "hold_s": max_hold,
        "protocol": settled,
        "offers": offers,
        **verdicts,
    }
    if not reply.HasField("envelope"):
        return ControlReply(200, json.dumps(fields, separators=(",", ":")).encode())
    # Trace context rides beside each envelope, never in it (gateway/traces.py).
    traced = traces.handout(reply.traceparent, collector_id, reply.dispatch_id, transport)
    if traced:
        fields["traceparent"] = traced
    # Envelopes are embedded byte for byte: the gateway never re-serialises signed material.
    head = json.dumps({"dispatch_id": reply.dispatch_id, **fields}, separators=(",", ":"))
    payload = head[:-1].encode() + b',"envelope":' + reply.envelope.envelope_json
    if reply.more:
        items = (
            b'{"dispatch_id":'
            + json.dumps(m.dispatch_id).encode()
            + _traceparent_member(traces.handout(m.traceparent, collector_id, m.dispatch_id, transport))
            + b',"envelope":'
            + m.envelope.envelope_json
            + b"}"
            for m in reply.more
        )
        payload += b',"more":[' + b",".join(items) + b"]"
    return ControlReply(200, payload + b"}")
