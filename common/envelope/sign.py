"""Control-plane side: build and sign an envelope with the current dispatch key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from common.envelope import wire
from common.envelope.canonical import MAX_PARAMS_BYTES, MAX_TEXT_BYTES, EnvelopeFields, OpClass, assemble
from common.keys import SigningKey

_OP_CLASSES = frozenset(c.value for c in OpClass)


@dataclass(frozen=True, slots=True)
class EnvelopeDraft:
    """What the router knows about one dispatch attempt; the kid and params hash are added on signing."""

    task_id: str
    collector_id: str
    provider: str
    operation: str
    op_class: str
    target_ref: str
    idempotency_key: str
    params: bytes
    not_before: int
    expires_at: int
    lease_epoch: int = 0


def sign(draft: EnvelopeDraft, key: SigningKey) -> bytes:
    """The wire JSON of the signed envelope.

    Raises ``ValueError`` naming the field for a draft no verifier would accept
    (text over its limit, unknown op_class, params too large, bad times).
    """
    d = draft
    texts = (
        key.kid,
        d.task_id,
        d.collector_id,
        d.provider,
        d.operation,
        d.op_class,
        d.target_ref,
        d.idempotency_key,
    )
    encoded = [t.encode("utf-8") for t in texts]
    for name, raw in zip(("task_id", "collector_id", "provider", "operation"), encoded[1:5], strict=True):
        if len(raw) > MAX_TEXT_BYTES:
            raise ValueError(f"{name} exceeds {MAX_TEXT_BYTES} bytes")
    if len(encoded[6]) > MAX_TEXT_BYTES or len(encoded[7]) > MAX_TEXT_BYTES:
        raise ValueError(f"target_ref and idempotency_key are limited to {MAX_TEXT_BYTES} bytes")
    if d.op_class not in _OP_CLASSES:
        raise ValueError(f"op_class must be one of {sorted(_OP_CLASSES)}")
    if len(d.params) > MAX_PARAMS_BYTES:
        raise ValueError(f"params exceed {MAX_PARAMS_BYTES} bytes")
    if not (
        0 <= d.not_before <= d.expires_at <= wire.MAX_SAFE_INT and 0 <= d.lease_epoch <= wire.MAX_SAFE_INT
    ):
        raise ValueError("need 0 <= not_before <= expires_at <= 2^53-1 and 0 <= lease_epoch <= 2^53-1")
    digest = hashlib.sha256(d.params).digest()
    signature = key.sign(assemble(encoded, digest, d.not_before, d.expires_at, d.lease_epoch))
    fields = EnvelopeFields(*texts, digest, d.not_before, d.expires_at, d.lease_epoch)
    return wire.encode(fields, d.params, signature)
