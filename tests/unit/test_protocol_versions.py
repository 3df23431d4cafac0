"""Collector protocol versions: negotiation, and the golden frames of vectors/protocol/ read by both
sides (docs/protocol.md, compatibility rules)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from collector.client import read_claim_answer, settled_version
from collector.request_auth import frame_body
from collector.ws_control import parse_frame
from common import protocol
from common.errors import InvalidArgument, VersusError
from common.limits import MAX_OUTPUT_CHUNK
from common.trust import collector_jwt
from gateway.collector_bodies import ByeBody, CapabilitiesBody, ClaimBody, ReportBody, RevokedBody
from gateway.control_frames import parse_frame as _parse
from gateway.enroll_api import parse_body
from gateway.output_api import check_version as check_output_version
from gateway.output_api import parse_target

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "protocol"
BODIES: dict[str, type[BaseModel]] = {
    "claim": ClaimBody,
    "report": ReportBody,
    "capabilities": CapabilitiesBody,
    "bye": ByeBody,
    "revoked": RevokedBody,
}


def _vectors() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(VECTORS.glob("v*.json"))]


def _messages() -> list[Any]:
    return [
        pytest.param(m, id=f"v{doc['version']}: {m['name']}")
        for doc in _vectors()
        for m in doc["collector_messages"]
    ]


def _answers() -> list[Any]:
    return [
        pytest.param(a, id=f"v{doc['version']}: {a['name']}")
        for doc in _vectors()
        for a in doc["gateway_answers"]
    ]


def test_every_supported_version_has_its_golden_frames() -> None:
    versions = sorted(doc["version"] for doc in _vectors())
    assert versions == list(range(1, protocol.PROTOCOL_VERSION + 1))
    assert set(protocol.HISTORY) == set(versions)


class OutputChunk(BaseModel):
    dispatch_id: str
    offset: int
    data: bytes


def _read(message: dict[str, Any]) -> tuple[str, int, BaseModel]:
    """What the gateway reads from a collector message: its type, version and body."""
    if message["transport"] == "wss":
        _, kind, _, raw, version = _parse(message["frame"])
    elif "body_hex" in message:  # an output chunk: binary, its dispatch and offset in the query
        path, _, query = message["path"].partition("?")
        version = check_output_version(message["headers"].get(protocol.HEADER))
        fields = dict(urllib.parse.parse_qsl(query))
        dispatch_id, offset = parse_target(fields.get("task_id", ""), fields.get("offset", ""))
        data = bytes.fromhex(message["body_hex"])
        assert len(data) <= MAX_OUTPUT_CHUNK
        return path.rsplit("/", 1)[1], version, OutputChunk(dispatch_id=dispatch_id, offset=offset, data=data)
    else:
        kind = message["path"].rsplit("/", 1)[1]
        version = protocol.header_version(message["headers"].get(protocol.HEADER))
        raw = json.dumps(message["body"]).encode()
    body = parse_body(BODIES[kind], raw)
    if isinstance(body, ReportBody | RevokedBody):
        body.check_version(version)
    return kind, version, body


@pytest.mark.parametrize("message", _messages())
def test_the_gateway_reads_every_collector_message_of_every_version(message: dict[str, Any]) -> None:
    if message["expect"] != "read":
        with pytest.raises(VersusError) as refused:
            _read(message)
        assert refused.value.code == message["expect"]
        return
    kind, version, body = _read(message)
    assert protocol.MIN_PROTOCOL_VERSION <= version <= protocol.PROTOCOL_VERSION
    if isinstance(body, ClaimBody):
        offer = body.offer()
        assert protocol.negotiate(offer) == min(offer.max, protocol.PROTOCOL_VERSION)
    if kind == "bye":
        assert version >= 2, "bye exists from protocol 2"


@pytest.mark.parametrize("message", [m for m in _messages() if m.values[0].get("bsh")])
def test_from_seven_a_frame_binds_its_body_text_as_sent(message: dict[str, Any]) -> None:
    # The bytes are the body string's UTF-8, exactly: no canonical form to reproduce.
    _, _, _, raw, version = _parse(message["frame"])
    assert version >= protocol.FRAME_BODY_AS_TEXT
    assert raw == bytes.fromhex(message["body_utf8_hex"])
    assert collector_jwt.body_digest(raw) == message["bsh"]


def test_before_seven_a_frame_binds_the_canonical_form_of_its_body_object() -> None:
    frame = '{"v": 6, "id": "1", "type": "bye", "body": {"session_id": "s-6", "reason": "arr\u00eat"}}'
    raw = _parse(frame)[3]
    assert raw == b'{"reason":"arr\\u00eat","session_id":"s-6"}'


def test_the_collector_writes_its_frames_as_the_gateway_reads_them() -> None:
    body = {"session_id": "s-7", "reason": "arrêt", "claim_seq": 1}
    for version in (1, protocol.FRAME_BODY_AS_TEXT - 1, protocol.FRAME_BODY_AS_TEXT):
        member, bound = frame_body(version, body)
        frame = json.dumps({"v": version, "id": "1", "type": "bye", "body": member})
        assert _parse(frame)[3] == bound
        assert json.loads(bound) == body


@pytest.mark.parametrize("answer", _answers())
def test_the_collector_reads_every_gateway_answer_of_every_version(answer: dict[str, Any]) -> None:
    if answer["transport"] == "wss":
        _, (status, raw, headers) = parse_frame(answer["frame"])
    else:
        status, raw, headers = answer["status"], answer["body"].encode(), answer["headers"]
    reply, settled = read_claim_answer(status, raw, httpx.Headers(headers), 0.0, 0.0)
    assert settled == answer["protocol"]
    assert reply.dispatch_id == answer.get("dispatch_id")
    assert reply.verdicts == answer.get("verdicts", {})
    assert reply.revokes == answer.get("revokes", [])
    assert reply.credentials == answer.get("credentials", {})
    if answer.get("verdicts"):
        assert reply.cancel_grace_s == answer["cancel_grace_s"]
    if "envelope" in answer:
        # The exact bytes, members unknown to this build notwithstanding.
        assert reply.envelope == answer["envelope"].encode()
    else:
        assert reply.envelope is None


def test_negotiation_settles_the_highest_version_both_speak() -> None:
    newest = protocol.PROTOCOL_VERSION
    assert protocol.negotiate(protocol.Offer(1, 1)) == 1
    assert protocol.negotiate(protocol.Offer(1, newest)) == newest
    assert protocol.negotiate(protocol.Offer(1, newest + 5)) == newest  # a newer collector
    with pytest.raises(protocol.VersionUnsupported) as above:
        protocol.negotiate(protocol.Offer(newest + 1, newest + 3))
    # Legible: the code, and the range this side speaks.
    assert above.value.code == "version_unsupported"
    assert above.value.details == {"min": protocol.MIN_PROTOCOL_VERSION, "max": newest}


def test_a_message_version_outside_the_range_or_not_a_number_is_refused() -> None:
    assert protocol.header_version(None) == 1
    assert protocol.header_version(" 2 ") == 2
    for bad in ("0", str(protocol.PROTOCOL_VERSION + 1), "two", "1.5", ""):
        with pytest.raises(protocol.VersionUnsupported):
            protocol.header_version(bad)
    for bad_value in (0, True, 2.0, "1", None, 10**9):
        with pytest.raises(protocol.VersionUnsupported):
            protocol.check_message(bad_value)


def test_an_offer_is_checked_before_it_is_settled() -> None:
    assert protocol.Offer.parse(None) == protocol.Offer(1, 1)
    assert protocol.Offer.parse({"min": 1, "max": 4}) == protocol.Offer(1, 4)
    for bad in ({"min": 2, "max": 1}, {"min": 0, "max": 1}, {"min": "1", "max": 2}, [1, 2], {"max": 2}):
        with pytest.raises(InvalidArgument):
            protocol.Offer.parse(bad)


def test_a_claim_answer_without_a_version_settles_one() -> None:
    # A gateway from before negotiation names no version: both sides then speak 1.
    assert settled_version(None) == 1
    assert settled_version("2") == 2
    assert settled_version(protocol.PROTOCOL_VERSION + 1) == 1  # never trust a version we do not speak
    assert settled_version("x") == 1
