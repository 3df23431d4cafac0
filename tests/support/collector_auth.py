"""Test collectors that sign what they send as the reference collector does.

Every HTTPS request carries a token bound to its method, path and body
(``SignRequests``, an httpx auth flow that signs the request as it is sent), and
every control-socket frame carries its own (``SigningSocket``); reports carry
the collector's signature (``signed_report``). Tests that probe refusals build
their tokens and signatures by hand instead.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from collector.request_auth import SignRequests, bound_token, frame_token, signed_report
from common import protocol
from common.trust import collector_jwt

__all__ = [
    "SignRequests",
    "SigningSocket",
    "bound_token",
    "signed_frame",
    "signed_report",
    "with_report_signature",
]


def with_report_signature(
    key: ec.EllipticCurvePrivateKey, collector_id: str, body: dict[str, Any]
) -> dict[str, Any]:
    """A report body signed as the reference collector signs it; one that cannot be (no task_id,
    result_b64 that is not base64, ...) or already is, unchanged, for the gateway to judge."""
    if "signature" in body:
        return body
    try:
        return signed_report(key, collector_id, body)
    except (KeyError, ValueError, TypeError):
        return body


def signed_frame(key: ec.EllipticCurvePrivateKey, collector_id: str, text: str | bytes) -> str | bytes:
    """``text`` with an ``auth`` token added when it is a frame object with a type and an object body."""
    try:
        frame = json.loads(text)
    except ValueError:
        return text
    if not isinstance(frame, dict) or "auth" in frame or not isinstance(frame.get("type"), str):
        return text
    body = frame.get("body", {})
    version = frame.get("v")
    if isinstance(body, str) and isinstance(version, int) and version >= protocol.FRAME_BODY_AS_TEXT:
        # The body's text as given, its bytes bound exactly (a report's signature is the caller's).
        frame["auth"] = frame_token(key, collector_id, frame["type"], body.encode())
        signed = json.dumps(frame)
        return signed.encode() if isinstance(text, bytes) else signed
    if not isinstance(body, dict):
        return text
    if frame["type"] == "report":
        body = frame["body"] = with_report_signature(key, collector_id, body)
    frame["auth"] = frame_token(key, collector_id, frame["type"], collector_jwt.frame_body(body))
    signed = json.dumps(frame)
    return signed.encode() if isinstance(text, bytes) else signed


class SigningSocket:
    """A client WebSocket whose ``send`` signs each frame (``raw`` is the socket itself)."""

    def __init__(self, raw: Any, key: ec.EllipticCurvePrivateKey, collector_id: str):
        self.raw = raw
        self._key = key
        self._collector_id = collector_id

    async def send(self, message: str | bytes) -> None:
        await self.raw.send(signed_frame(self._key, self._collector_id, message))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __aiter__(self) -> Any:
        return self.raw.__aiter__()

    async def __aenter__(self) -> SigningSocket:
        await self.raw.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.raw.__aexit__(*exc)
