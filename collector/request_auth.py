"""Signing what a collector sends: a bearer token bound to each request and each control frame,
and its own signature on each report.

See ``common.trust.collector_jwt`` for the claims. ``SignRequests`` is an httpx auth
flow, so the token is computed over the request exactly as it goes on the wire
(method, path with query, body bytes); ``frame_token`` does the same for a
control-socket frame. ``signed_report`` adds the report signature the router
checks (``common.trust.report_signature``).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Generator, Mapping
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from common import protocol
from common.trust import collector_jwt, report_signature
from common.trust.report_signature import ReportStatement

API = "/api/collector/v1"


def bound_token(
    key: ec.EllipticCurvePrivateKey, collector_id: str, method: str, path: str, body: bytes = b""
) -> str:
    """A fresh token for one request (``path`` with any query)."""
    return collector_jwt.mint(key, collector_id, int(time.time()), method=method, path=path, body=body)


def frame_body(version: int, body: Mapping[str, Any]) -> tuple[Any, bytes]:
    """A request frame's ``body`` member written in protocol ``version``, and the bytes its token binds.

    From protocol 7 the member is the body's JSON text and the token binds that text's UTF-8 bytes,
    whatever JSON encoder wrote them; before it, the member is the object and the token binds its
    canonical form (``collector_jwt.frame_body``)."""
    if version >= protocol.FRAME_BODY_AS_TEXT:
        text = json.dumps(body, separators=(",", ":"))
        return text, text.encode()
    return body, collector_jwt.frame_body(body)


def frame_token(key: ec.EllipticCurvePrivateKey, collector_id: str, kind: str, body: bytes) -> str:
    """The ``auth`` of a control frame of type ``kind`` whose token binds ``body`` (:func:`frame_body`)."""
    return bound_token(key, collector_id, collector_jwt.FRAME, f"{API}/{kind}", body)


def _output(output: object) -> dict[str, Any]:
    if not isinstance(output, Mapping):
        return {}
    return {"output_length": int(output["length"]), "output_sha256": str(output["sha256"])}


def signed_report(
    key: ec.EllipticCurvePrivateKey, collector_id: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    """``body`` (a report as the gateway takes it) with the collector's ``signature`` over what it says."""
    statement = ReportStatement(
        collector_id,
        str(body["task_id"]),
        str(body["outcome"]),
        base64.b64decode(str(body.get("result_b64", ""))),
        str(body.get("error_code", "")),
        str(body.get("error_message", "")),
        **_output(body.get("output")),
    )
    return {**body, "signature": report_signature.sign(key, statement, int(time.time()))}


class SignRequests(httpx.Auth):
    """Signs each request as it is sent, over its exact method, path (with query) and body."""

    requires_request_body = True

    def __init__(self, key: ec.EllipticCurvePrivateKey, collector_id: str):
        self._key = key
        self.collector_id = collector_id

    def __repr__(self) -> str:
        return f"SignRequests({self.collector_id!r})"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        path = request.url.raw_path.decode("ascii")
        token = bound_token(self._key, self.collector_id, request.method, path, request.content)
        request.headers["Authorization"] = "Bearer " + token
        yield request
