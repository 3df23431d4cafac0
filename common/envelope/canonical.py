"""Canonical bytes of a ``VERSUS-TASK-V1`` envelope: the exact bytes that are signed.

Layout (docs/envelope.md): a sequence of fields, each written as a 4-byte
big-endian unsigned length followed by that many bytes. The first field is the
domain separator ``VERSUS-TASK-V1``; the rest follow in :data:`FIELD_ORDER`.
Text is UTF-8 without normalisation; integers are 8-byte big-endian; the params
hash is its 32 raw bytes. An absent text field is the empty string and an
absent integer is 0, so absent and empty encode identically.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

DOMAIN_SEPARATOR = b"VERSUS-TASK-V1"

# Limits enforced when decoding and signing (docs/envelope.md, "Limits").
MAX_TEXT_BYTES = 1024
MAX_PARAMS_BYTES = 1024 * 1024
UINT64_MAX = 2**64 - 1

_LEN = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class OpClass(StrEnum):
    READ = "read"
    MUTATE_RECONCILABLE = "mutate_reconcilable"
    MUTATE_TERMINAL = "mutate_terminal"


class EnvelopeFields(NamedTuple):
    """Every signed field of an envelope, in canonical order.

    A NamedTuple rather than a frozen dataclass: it is built on every decode and
    tuple construction is several times cheaper.
    """

    kid: str
    task_id: str
    collector_id: str
    provider: str
    operation: str
    op_class: str
    target_ref: str
    idempotency_key: str
    params_sha256: bytes
    not_before: int
    expires_at: int
    lease_epoch: int


FIELD_ORDER: tuple[str, ...] = (
    "kid",
    "task_id",
    "collector_id",
    "provider",
    "operation",
    "op_class",
    "target_ref",
    "idempotency_key",
    "params_sha256",
    "not_before",
    "expires_at",
    "lease_epoch",
)
TEXT_FIELDS: tuple[str, ...] = FIELD_ORDER[:8]
TIME_FIELDS: tuple[str, ...] = ("not_before", "expires_at")

_PREFIX = _LEN.pack(len(DOMAIN_SEPARATOR)) + DOMAIN_SEPARATOR
_HASH_LEN = _LEN.pack(32)
# The three integers, each as a length-prefixed 8-byte field.
_TAIL = struct.Struct(">IQIQIQ")


def assemble(
    texts: Sequence[bytes], params_sha256: bytes, not_before: int, expires_at: int, lease_epoch: int
) -> bytes:
    """Canonical bytes from the eight text fields already encoded as UTF-8, in :data:`TEXT_FIELDS` order.

    Encoders and decoders call this directly so each text is encoded once. It is
    unrolled because it runs for every envelope signed or verified.
    """
    kid, task_id, collector_id, provider, operation, op_class, target_ref, idempotency_key = texts
    n = _LEN.pack
    return b"".join(
        (
            _PREFIX,
            n(len(kid)),
            kid,
            n(len(task_id)),
            task_id,
            n(len(collector_id)),
            collector_id,
            n(len(provider)),
            provider,
            n(len(operation)),
            operation,
            n(len(op_class)),
            op_class,
            n(len(target_ref)),
            target_ref,
            n(len(idempotency_key)),
            idempotency_key,
            _HASH_LEN,
            params_sha256,
            _TAIL.pack(8, not_before, 8, expires_at, 8, lease_epoch),
        )
    )


def canonical_bytes(f: EnvelopeFields) -> bytes:
    """The bytes covered by the signature. Callers have validated ranges and lengths."""
    texts = [t.encode("utf-8") for t in f[:8]]  # the text fields, in canonical order
    return assemble(texts, f.params_sha256, f.not_before, f.expires_at, f.lease_epoch)
