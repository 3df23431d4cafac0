"""Streamed task output over HTTPS (protocol 4, docs/protocol.md "Output streams").

    POST /api/collector/v1/output?task_id=<dispatch id>&offset=<byte offset>

The body is the chunk itself (``application/octet-stream``, at most
:data:`common.limits.MAX_OUTPUT_CHUNK` bytes), never re-encoded; the bearer
token binds the method, the path with its query and the body's SHA-256, so
nothing on the way can move a chunk or change it. Output always travels this
way, even while the control socket is up: binary chunks have no place in JSON
frames.

Answers: 200 ``{"acked": n}`` (the chunk is stored; the next starts at n), or
409 ``output_gap`` / ``output_overlap`` with ``details.acked`` (the chunk does
not start at the ack: resume from it). The router holds the rules
(router/output/streams.py).
"""

from __future__ import annotations

import json
import re

from fastapi import APIRouter, Query, Request, Response
from versus.router.v1 import collector_bridge_pb2 as bpb

from common import protocol
from common.errors import Conflict, InvalidArgument, UnsupportedMediaType
from common.limits import MAX_OUTPUT_CHUNK
from gateway.auth import authenticate, check_body
from gateway.body import read_body

router = APIRouter(prefix="/api/collector/v1", tags=["collector"])

_REFUSED = {
    bpb.APPEND_OUTCOME_GAP: ("output_gap", "the chunk starts past the output stored so far"),
    bpb.APPEND_OUTCOME_OVERLAP: ("output_overlap", "the chunk starts before the end of the output stored"),
}


_DISPATCH_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def check_version(header: str | None) -> int:
    """The version an output request is written in, if it can carry output (4 or later)."""
    version = protocol.header_version(header)
    floor = protocol.floor_of("output_stream")
    if version < floor:
        raise protocol.VersionUnsupported(
            f"output is a protocol {floor} message; this one is written in {version}"
        )
    return version


def parse_target(task_id: str, offset: str) -> tuple[str, int]:
    """The dispatch and offset a chunk is for, from the query (``invalid_query`` otherwise)."""
    if not _DISPATCH_ID.match(task_id):
        raise InvalidArgument("task_id must be a dispatch id", code="invalid_query")
    if not offset.isdigit() or len(offset) > 19 or int(offset) > 2**62:
        raise InvalidArgument("offset must be a byte offset (a non-negative integer)", code="invalid_query")
    return task_id, int(offset)


@router.post(
    "/output",
    responses={
        200: {"description": 'Stored: `{"acked": n}`, the offset the next chunk starts at'},
        409: {"description": "`output_gap` or `output_overlap`, with `details.acked`: resume from there"},
    },
)
async def output(
    request: Request,
    task_id: str = Query(default="", description="the dispatch id (the envelope's task_id)"),
    offset: str = Query(default="", description="the byte offset the chunk starts at"),
) -> Response:
    """One chunk of a task's output at its byte offset (protocol 4; `X-Versus-Protocol: 4` or later)."""
    version = check_version(request.headers.get(protocol.HEADER))
    dispatch_id, start = parse_target(task_id, offset)
    claims, _ = await authenticate(request, request.app.state.store, body_follows=True)
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/octet-stream":
        raise UnsupportedMediaType(
            "an output chunk is application/octet-stream", code="unsupported_media_type"
        )
    data = await read_body(request, MAX_OUTPUT_CHUNK)
    check_body(claims, data)
    reply = await request.app.state.backends.bridge_call(
        "append_output",
        bpb.AppendOutputRequest(
            collector_id=claims.collector_id, dispatch_id=dispatch_id, offset=start, data=data
        ),
        request.state.request_id,
    )
    if reply.outcome in _REFUSED:
        code, message = _REFUSED[reply.outcome]
        raise Conflict(
            f"{message}; resume from offset {reply.acked}", code=code, details={"acked": reply.acked}
        )
    body = json.dumps({"acked": reply.acked}).encode()
    return Response(body, media_type="application/json", headers={protocol.HEADER: str(version)})
