"""Control-plane side: build and sign an envelope with the current dispatch key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from common.envelope import wire
from common.envelope.canonical import MAX_PARAMS_BYTES, MAX_TEXT_BYTES, TEXT_FIELDS, OpClass, assemble
from common.trust.keys import SigningKey

_OP_CLASSES = frozenset(c.value for c in OpClass)
_MAX_INT = wire.MAX_SAFE_INT


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


def _refusal(draft: EnvelopeDraft, encoded: list[bytes]) -> ValueError:
    """Slow path: why a draft failed the combined check in :func:`sign`."""
    for name, raw in zip(TEXT_FIELDS, encoded, strict=True):
        if len(raw) > MAX_TEXT_BYTES:
            return ValueError(f"{name} exceeds {MAX_TEXT_BYTES} bytes")
    if draft.op_class not in _OP_CLASSES:
        return ValueError(f"op_class must be one of {sorted(_OP_CLASSES)}")
    if len(draft.params) > MAX_PARAMS_BYTES:
        return ValueError(f"params exceed {MAX_PARAMS_BYTES} bytes")
    return ValueError("need 0 <= not_before <= expires_at <= 2^53-1 and 0 <= lease_epoch <= 2^53-1")


def sign(draft: EnvelopeDraft, key: SigningKey) -> bytes:
    """The wire JSON of the signed envelope.

    Raises ``ValueError`` naming the problem for a draft no verifier would accept
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
    if (
        max(map(len, encoded)) > MAX_TEXT_BYTES
        or d.op_class not in _OP_CLASSES
        or len(d.params) > MAX_PARAMS_BYTES
        or not (0 <= d.not_before <= d.expires_at <= _MAX_INT and 0 <= d.lease_epoch <= _MAX_INT)
    ):
        raise _refusal(d, encoded)
    digest = hashlib.sha256(d.params).digest()
    signature = key.sign(assemble(encoded, digest, d.not_before, d.expires_at, d.lease_epoch))
    return wire.encode_parts(texts, d.params, digest, d.not_before, d.expires_at, d.lease_epoch, signature)
