"""The wire (JSON) form of an envelope, decoded strictly.

Decoding never raises anything but :class:`EnvelopeError`: whatever bytes
arrive, the caller gets either a fully validated envelope or a stable code.
Checks run in a fixed order and the first problem found is reported:

1. size of the raw input (``envelope_too_large``);
2. JSON syntax, top-level object, duplicate or unknown keys, then types and
   ranges: the text fields in canonical order, params / params_sha256 / sig,
   the integers; then op_class and not_before <= expires_at (``envelope_malformed``);
3. params: length (``params_too_large``), then base64 (``envelope_bad_encoding``);
4. params_sha256 hex, then sig base64, canonical spellings only (``envelope_bad_encoding``);
5. sig and params_sha256 lengths (``envelope_bad_length``).

This is on every collector's hot path, so it is written for speed: each text
field is UTF-8 encoded once and reused for the canonical bytes.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Sequence
from json.encoder import encode_basestring
from typing import Any, NamedTuple

from common.envelope.canonical import (
    MAX_PARAMS_BYTES,
    MAX_TEXT_BYTES,
    TEXT_FIELDS,
    EnvelopeFields,
    OpClass,
    assemble,
)
from common.envelope.codes import EnvelopeError, Rejection

SIGNATURE_BYTES = 64
HASH_BYTES = 32
# JSON numbers above 2^53 - 1 are not exact in every language; integers are limited to that.
MAX_SAFE_INT = 2**53 - 1
# Base64 of the largest params plus every other field at its limit, with room to spare.
MAX_WIRE_BYTES = 2 * 1024 * 1024
_MAX_PARAMS_B64 = (MAX_PARAMS_BYTES + 2) // 3 * 4

INT_FIELDS: tuple[str, ...] = ("not_before", "expires_at", "lease_epoch")
WIRE_KEYS: tuple[str, ...] = (*TEXT_FIELDS, "params", "params_sha256", *INT_FIELDS, "sig")
_WIRE_KEY_SET = frozenset(WIRE_KEYS)
_OP_CLASS_NAMES = frozenset(c.value for c in OpClass)
_OP_CLASSES = frozenset(name.encode() for name in _OP_CLASS_NAMES)


class WireEnvelope(NamedTuple):
    """A decoded envelope: signed fields, params exactly as received, signature, and the canonical bytes."""

    fields: EnvelopeFields
    params: bytes
    signature: bytes
    canonical: bytes


class _Pairs(list[tuple[str, Any]]):
    """Marks a decoded JSON object, so duplicates can be seen and arrays told apart."""


_DECODER = json.JSONDecoder(object_pairs_hook=_Pairs)


def _malformed(message: str) -> EnvelopeError:
    return EnvelopeError(Rejection.MALFORMED, message)


def _parse(raw: bytes | str) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = raw.encode("utf-8")
        except UnicodeEncodeError:
            raise _malformed("not valid UTF-8") from None
    if len(raw) > MAX_WIRE_BYTES:
        raise EnvelopeError(Rejection.TOO_LARGE, f"envelope is {len(raw)} bytes, limit {MAX_WIRE_BYTES}")
    try:
        pairs = _DECODER.decode(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _malformed(f"not valid JSON: {type(exc).__name__}") from None
    if type(pairs) is not _Pairs:
        raise _malformed("envelope must be a JSON object")
    obj = dict(pairs)
    if len(obj) != len(pairs):
        # Parsers disagree on which duplicate wins; refusing them removes the ambiguity.
        raise _malformed("duplicate key")
    if not obj.keys() <= _WIRE_KEY_SET:
        raise _malformed(f"unknown field {sorted(obj.keys() - _WIRE_KEY_SET)[0]!r}")
    return obj


def _b64(name: str, value: str) -> bytes:
    try:
        # strict_mode refuses non-alphabet characters, missing or excess padding.
        decoded = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(Rejection.BAD_ENCODING, f"{name} is not valid base64") from None
    # Only the canonical spelling is accepted: unused bits of the last quantum must be zero.
    tail = len(decoded) % 3
    if tail and binascii.b2a_base64(decoded[-tail:], newline=False).decode() != value[-4:]:
        raise EnvelopeError(Rejection.BAD_ENCODING, f"{name} is not canonical base64")
    return decoded


def _hex(name: str, value: str) -> bytes:
    try:
        decoded = bytes.fromhex(value)
    except ValueError:
        raise EnvelopeError(Rejection.BAD_ENCODING, f"{name} is not valid hex") from None
    if decoded.hex() != value:
        raise EnvelopeError(Rejection.BAD_ENCODING, f"{name} must be lowercase hex without separators")
    return decoded


def _explain_malformed(obj: dict[str, Any]) -> EnvelopeError:
    """Slow path: the precise reason the fast checks in :func:`decode` failed, in documented order."""
    for name in TEXT_FIELDS:
        value = obj.get(name, "")
        if type(value) is not str:
            return _malformed(f"{name} must be a string")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            return _malformed(f"{name} is not valid Unicode (lone surrogate)")
        if size > MAX_TEXT_BYTES:
            return _malformed(f"{name} is {size} bytes, limit {MAX_TEXT_BYTES}")
    for name in ("params", "params_sha256", "sig"):
        if type(obj.get(name, "")) is not str:
            return _malformed(f"{name} must be a string")
    for name in INT_FIELDS:
        if _integer(obj.get(name, 0)) is None:
            return _malformed(f"{name} must be an integer in 0..{MAX_SAFE_INT}")
    if obj.get("op_class", "") not in _OP_CLASS_NAMES:
        return _malformed("op_class must be read, mutate_reconcilable or mutate_terminal")
    return _malformed("not_before is after expires_at")


def _integer(value: Any) -> int | None:
    # Some languages cannot tell 5 from 5.0 in JSON; the value is what counts.
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is int and 0 <= value <= MAX_SAFE_INT:
        return value
    return None


def decode(raw: bytes | str) -> WireEnvelope:
    """Validate and decode wire JSON; raises :class:`EnvelopeError` with a stable code.

    The common case runs a few cheap combined checks; only when one fails does
    :func:`_explain_malformed` work out which rule was broken.
    """
    obj = _parse(raw)
    get = obj.get
    texts = [get(name, "") for name in TEXT_FIELDS]
    try:
        encoded = [value.encode("utf-8") for value in texts]
    except (AttributeError, UnicodeEncodeError):  # not a string, or a lone surrogate
        raise _explain_malformed(obj) from None
    not_before, expires_at, lease_epoch = (_integer(get(name, 0)) for name in INT_FIELDS)
    params_b64, hash_hex, sig_b64 = get("params", ""), get("params_sha256", ""), get("sig", "")
    if (
        max(map(len, encoded)) > MAX_TEXT_BYTES
        or type(params_b64) is not str
        or type(hash_hex) is not str
        or type(sig_b64) is not str
        or not_before is None
        or expires_at is None
        or lease_epoch is None
        or encoded[5] not in _OP_CLASSES
        or not_before > expires_at
    ):
        raise _explain_malformed(obj)
    # Oversized params are refused before decoding them, and again exactly after.
    if len(params_b64) > _MAX_PARAMS_B64:
        raise EnvelopeError(Rejection.PARAMS_TOO_LARGE, f"params exceed {MAX_PARAMS_BYTES} bytes")
    params = _b64("params", params_b64)
    if len(params) > MAX_PARAMS_BYTES:
        raise EnvelopeError(Rejection.PARAMS_TOO_LARGE, f"params exceed {MAX_PARAMS_BYTES} bytes")
    params_sha256 = _hex("params_sha256", hash_hex)
    signature = _b64("sig", sig_b64)
    if len(signature) != SIGNATURE_BYTES:
        raise EnvelopeError(
            Rejection.BAD_LENGTH, f"sig is {len(signature)} bytes, expected {SIGNATURE_BYTES}"
        )
    if len(params_sha256) != HASH_BYTES:
        raise EnvelopeError(
            Rejection.BAD_LENGTH, f"params_sha256 is {len(params_sha256)} bytes, expected {HASH_BYTES}"
        )
    fields = EnvelopeFields(*texts, params_sha256, not_before, expires_at, lease_epoch)  # type: ignore[call-arg]
    canonical = assemble(encoded, params_sha256, not_before, expires_at, lease_epoch)
    return WireEnvelope(fields, params, signature, canonical)


# The wire JSON is assembled around the params so their base64 (up to 1.4 MB) is
# copied once, by the final join, and never decoded to str and encoded back.
_HEAD = (
    '{"kid":%s,"task_id":%s,"collector_id":%s,"provider":%s,"operation":%s,"op_class":%s,'
    '"target_ref":%s,"idempotency_key":%s,"params":"'
)
_TAIL = '","params_sha256":"%s","not_before":%d,"expires_at":%d,"lease_epoch":%d,"sig":"%s"}'


def encode(fields: EnvelopeFields, params: bytes, signature: bytes) -> bytes:
    """Wire JSON with keys in a fixed order (the order is not significant to a verifier)."""
    f = fields
    # The first eight members of EnvelopeFields are the text fields, in canonical order.
    return encode_parts(f[:8], params, f.params_sha256, f.not_before, f.expires_at, f.lease_epoch, signature)


def encode_parts(
    texts: Sequence[str],
    params: bytes,
    params_sha256: bytes,
    not_before: int,
    expires_at: int,
    lease_epoch: int,
    signature: bytes,
) -> bytes:
    """:func:`encode` from loose parts (the text fields in canonical order), for the signing hot path."""
    head = _HEAD % tuple(map(encode_basestring, texts))
    sig = binascii.b2a_base64(signature, newline=False).decode("ascii")
    tail = _TAIL % (params_sha256.hex(), not_before, expires_at, lease_epoch, sig)
    return b"".join((head.encode("utf-8"), binascii.b2a_base64(params, newline=False), tail.encode("ascii")))
