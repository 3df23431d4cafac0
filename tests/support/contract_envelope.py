"""The contract client's envelope check (tests/support/contract_client.py), written from
docs/envelope.md, "Verification", alone: every step, in order, with its code."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

SKEW_S = 30
OP_CLASSES = frozenset({"read", "mutate_reconcilable", "mutate_terminal"})
TEXT_FIELDS = ("kid", "task_id", "collector_id", "provider", "operation", "op_class", "target_ref",
               "idempotency_key")  # fmt: skip
INT_FIELDS = ("not_before", "expires_at", "lease_epoch")


class EnvelopeRefused(Exception):
    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for name, value in pairs:
        if name in seen:
            raise EnvelopeRefused("envelope_malformed")
        seen[name] = value
    return seen


def _canonical_b64(text: Any, size: int | None = None) -> bytes:
    if not isinstance(text, str):
        raise EnvelopeRefused("envelope_malformed")
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise EnvelopeRefused("envelope_bad_encoding") from None
    if base64.b64encode(raw).decode() != text:
        raise EnvelopeRefused("envelope_bad_encoding")
    if size is not None and len(raw) != size:
        raise EnvelopeRefused("envelope_bad_length")
    return raw


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def verify_envelope(
    raw: bytes,
    dispatch_keys: Mapping[str, tuple[ed25519.Ed25519PublicKey, float]],
    collector_id: str,
    now: float,
    seen: set[str],
) -> dict[str, Any]:
    """docs/envelope.md, "Verification", every step in order; the envelope's fields and params."""
    if len(raw) > 2 * 1024 * 1024:
        raise EnvelopeRefused("envelope_too_large")
    try:
        env = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError):
        raise EnvelopeRefused("envelope_malformed") from None
    allowed = {*TEXT_FIELDS, *INT_FIELDS, "params", "params_sha256", "sig"}
    if not isinstance(env, dict) or set(env) - allowed or any(v is None for v in env.values()):
        raise EnvelopeRefused("envelope_malformed")
    for name in TEXT_FIELDS:
        value = env.setdefault(name, "")
        try:
            if not isinstance(value, str) or len(value.encode()) > 1024:
                raise EnvelopeRefused("envelope_malformed")
        except UnicodeEncodeError:  # a lone surrogate has no UTF-8
            raise EnvelopeRefused("envelope_malformed") from None
    for name in INT_FIELDS:
        value = env.setdefault(name, 0)
        if isinstance(value, float) and value.is_integer():
            value = env[name] = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 2**53 - 1:
            raise EnvelopeRefused("envelope_malformed")
    if env["op_class"] not in OP_CLASSES or env["not_before"] > env["expires_at"]:
        raise EnvelopeRefused("envelope_malformed")
    params_text = env.get("params", "")
    if not isinstance(params_text, str) or len(params_text) > 4 * ((1024 * 1024 + 2) // 3):
        raise EnvelopeRefused("params_too_large" if isinstance(params_text, str) else "envelope_malformed")
    params = _canonical_b64(params_text) if params_text else b""
    hex_digest = env.get("params_sha256", hashlib.sha256(b"").hexdigest())
    if not isinstance(hex_digest, str) or hex_digest != hex_digest.lower():
        raise EnvelopeRefused("envelope_bad_encoding")
    try:
        params_sha256 = bytes.fromhex(hex_digest)
    except ValueError:
        raise EnvelopeRefused("envelope_bad_encoding") from None
    sig = _canonical_b64(env.get("sig", ""), 64)
    if len(params_sha256) != 32:
        raise EnvelopeRefused("envelope_bad_length")
    if env["kid"] not in dispatch_keys:
        raise EnvelopeRefused("unknown_kid")
    public, not_after = dispatch_keys[env["kid"]]
    if now > not_after:
        raise EnvelopeRefused("kid_expired")
    canonical = _frame(b"VERSUS-TASK-V1") + b"".join(_frame(env[n].encode()) for n in TEXT_FIELDS)
    canonical += _frame(params_sha256) + b"".join(_frame(env[n].to_bytes(8, "big")) for n in INT_FIELDS)
    try:
        public.verify(sig, canonical)
    except InvalidSignature:
        raise EnvelopeRefused("bad_signature") from None
    if env["collector_id"] != collector_id:
        raise EnvelopeRefused("wrong_collector")
    if now < env["not_before"] - SKEW_S:
        raise EnvelopeRefused("not_yet_valid")
    if now > env["expires_at"] + SKEW_S:
        raise EnvelopeRefused("expired")
    if hashlib.sha256(params).digest() != params_sha256:
        raise EnvelopeRefused("params_hash_mismatch")
    if env["task_id"] in seen:
        raise EnvelopeRefused("replayed_task")
    return {**env, "params_bytes": params}
