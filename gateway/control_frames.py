"""The control socket's frames as values: reading a request frame, writing an answer (no I/O).

    collector -> gateway  {"v": N, "id": "<request id>", "type": "claim|report|capabilities|bye",
                           "auth": "<bearer token>", "body": {...}}     (protocol 1-6)
                          {..., "body": "<the body's JSON text>"}      (protocol 7 on)
    gateway -> collector  {"v": N, "id": "<same id>", "type": "<type>.result", "status": 200|204|4xx|5xx,
                           "body": {...} | null}

The socket that carries them is gateway/control_ws.py; docs/protocol.md is the contract.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from common import error_mapping, protocol
from common.errors import InvalidArgument, VersusError
from common.trust import collector_jwt
from gateway.control_call import ControlReply

FRAME_ID_CHARS = 64


def result_frame(request_id: str, kind: str, reply: ControlReply, version: int = 1) -> str:
    """The answer to frame ``request_id`` of type ``kind``, written in ``version``."""
    body = reply.payload.decode() if reply.payload else "null"
    fields: dict[str, Any] = {"v": version, "id": request_id, "type": f"{kind}.result"}
    fields["status"] = reply.status
    if reply.headers:
        # What the HTTPS answer says in headers (a 204 claim's server time and hold).
        fields["headers"] = reply.headers
    return json.dumps(fields)[:-1] + ',"body":' + body + "}"


def error_reply(error: VersusError) -> ControlReply:
    """An error as the HTTPS answer would carry it: its status and JSON body."""
    status = error_mapping.status_for(error)
    return ControlReply(status.http_status, json.dumps(error.to_dict()).encode())


def frame_id_of(text: str | None) -> str:
    """The id of a frame refused before it was read in full (empty when it has none to echo)."""
    with contextlib.suppress(ValueError, RecursionError, TypeError):
        frame_id = json.loads(text or "").get("id")
        if isinstance(frame_id, str) and 0 < len(frame_id) <= FRAME_ID_CHARS:
            return frame_id
    return ""


def parse_frame(text: str | None) -> tuple[str, str, object, bytes, int]:
    """Validate a request frame's envelope: (id, type, auth, body bytes, version).

    The body's own schema is checked by the operation, on exactly the bytes returned here (the
    ones the frame's token is checked against)."""
    if text is None:
        raise InvalidArgument("frames must be text (JSON), not binary", code="malformed_frame")
    try:
        frame: Any = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        raise InvalidArgument("frame is not JSON", code="malformed_frame") from None
    if not isinstance(frame, dict) or "v" not in frame:
        raise InvalidArgument("frames must be objects with a protocol version v", code="malformed_frame")
    version = protocol.check_message(frame["v"])
    frame_id, kind = frame.get("id"), frame.get("type")
    if not isinstance(frame_id, str) or not 0 < len(frame_id) <= FRAME_ID_CHARS or not isinstance(kind, str):
        raise InvalidArgument("frames need a string id (1-64 chars) and type", code="malformed_frame")
    return frame_id, kind, frame.get("auth"), _body_bytes(frame, version), version


def _body_bytes(frame: dict[str, Any], version: int) -> bytes:
    """The bytes a request frame's token binds and its operation reads.

    From protocol 7 the body is JSON text in a string member, and those are its UTF-8 bytes, as an
    HTTPS body's are (absent: none). Before it, the body is an object, hashed in canonical form."""
    if version >= protocol.FRAME_BODY_AS_TEXT:
        text = frame.get("body", "")
        if not isinstance(text, str):
            raise InvalidArgument(
                f"from protocol {protocol.FRAME_BODY_AS_TEXT} a frame's body is its JSON text, as a string",
                code="malformed_frame",
            )
        try:
            return text.encode()
        except UnicodeEncodeError:  # a lone surrogate escape (\ud800) has no UTF-8 bytes
            raise InvalidArgument("body is not valid Unicode text", code="malformed_frame") from None
    body = frame.get("body", {})
    if not isinstance(body, dict):
        raise InvalidArgument("body must be an object", code="malformed_frame")
    return collector_jwt.frame_body(body)
