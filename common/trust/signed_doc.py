"""Signed documents: what the control plane tells a collector besides task envelopes.

Tunnel offers, collector configuration and trust bundles travel in claim answers, through
whatever proxy sits on the collector's path; they are signed with the same
dispatch keys as envelopes (the collector pins them at enrollment), so a proxy
can neither forge nor alter them. On the wire::

    {"kid": "dsp-…", "payload": "<base64url of the payload JSON>", "sig": "<base64url Ed25519>"}

The signature covers ``DOMAIN + payload bytes``, so a document can never be
mistaken for an envelope or another kind of signed text. Because the payload
travels as base64url, anything may re-serialize the outer object (the gateway
does) without breaking the signature. Every payload names its ``type``, the
``collector_id`` it is for, ``issued_at`` and ``expires_at`` (Unix seconds).

Pure code: the caller supplies keys and the time.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from typing import Any

from common.trust import b64url
from common.trust.keys import PublicKey, SigningKey

DOMAIN = b"versus-signed-document-v1\n"
MAX_DOCUMENT_CHARS = 16 * 1024
# How far a document's issued_at may be ahead of the verifier's clock.
ISSUED_SKEW_S = 60

TUNNEL_OFFER = "tunnel_offer"
COLLECTOR_CONFIG = "collector_config"
CA_BUNDLE = "ca_bundle"
RELAYED_CREDENTIAL = "relayed_credential"


class DocumentError(Exception):
    """A signed document was refused; ``code`` is stable (logged and counted by the collector)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def sign(key: SigningKey, payload: Mapping[str, Any]) -> dict[str, str]:
    """The wire form of ``payload`` signed with ``key``."""
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return {"kid": key.kid, "payload": b64url.encode(raw), "sig": b64url.encode(key.sign(DOMAIN + raw))}


def verify(
    document: object, trusted: Mapping[str, PublicKey], *, kind: str, collector_id: str, now: int
) -> dict[str, Any]:
    """The payload of ``document`` if it is a valid, unexpired ``kind`` for ``collector_id``.

    Raises :class:`DocumentError` with ``document_malformed``, ``unknown_kid``,
    ``kid_expired``, ``bad_signature``, ``wrong_type``, ``wrong_collector``,
    ``not_yet_valid`` or ``expired``.
    """
    payload = verify_signature(document, trusted, now)
    if payload.get("type") != kind:
        raise DocumentError("wrong_type", f"expected a {kind} document")
    if payload.get("collector_id") != collector_id:
        raise DocumentError("wrong_collector", "the document is for another collector")
    issued, expires = payload.get("issued_at"), payload.get("expires_at")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (issued, expires)):
        raise DocumentError("document_malformed", "issued_at and expires_at must be integers")
    assert isinstance(issued, int) and isinstance(expires, int)
    if issued > now + ISSUED_SKEW_S:
        raise DocumentError("not_yet_valid", "the document was issued in the future; check the clock")
    if now > expires:
        raise DocumentError("expired", "the document has expired")
    return payload


def verify_signature(document: object, trusted: Mapping[str, PublicKey], now: int) -> dict[str, Any]:
    """The payload if the signature verifies with a trusted, unexpired key (no other check)."""
    if not isinstance(document, Mapping):
        raise DocumentError("document_malformed", "a signed document is an object")
    kid, payload_b64, sig_b64 = document.get("kid"), document.get("payload"), document.get("sig")
    if not (isinstance(kid, str) and isinstance(payload_b64, str) and isinstance(sig_b64, str)):
        raise DocumentError("document_malformed", "kid, payload and sig must be strings")
    if len(payload_b64) + len(sig_b64) > MAX_DOCUMENT_CHARS:
        raise DocumentError("document_malformed", "the document is too large")
    key = trusted.get(kid)
    if key is None:
        raise DocumentError("unknown_kid", f"kid {kid!r} is not a trusted dispatch key")
    if key.expired(now):
        raise DocumentError("kid_expired", f"key {kid!r} has expired")
    try:
        raw, sig = b64url.decode(payload_b64), b64url.decode(sig_b64)
    except (binascii.Error, ValueError):
        raise DocumentError("document_malformed", "payload and sig must be base64url") from None
    if not key.verify(sig, DOMAIN + raw):
        raise DocumentError("bad_signature", "the document's signature does not verify")
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        raise DocumentError("document_malformed", "the payload is not JSON") from None
    if not isinstance(payload, dict):
        raise DocumentError("document_malformed", "the payload must be an object")
    return payload
