"""Fixed keys and times, and the helpers the envelope vector cases are built with: drafts, signed
envelopes, verify contexts and the mutations of a signed envelope."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

from common.envelope import wire
from common.envelope.codes import EnvelopeError
from common.envelope.sign import EnvelopeDraft, sign
from common.trust.keys import SigningKey, rfc3339

NOW = 1_767_225_600  # 2026-01-01T00:00:00Z
NOT_BEFORE = NOW - 60
EXPIRES_AT = NOW + 240
KEY_NOT_AFTER = NOW + 365 * 86_400


def seeded_key(label: str, not_after: int) -> SigningKey:
    seed = hashlib.sha256(f"versus-envelope-vector-key/{label}".encode()).digest()
    return SigningKey.from_seed(label, seed, not_after)


K1 = seeded_key("dsp-k1", KEY_NOT_AFTER)
K2 = seeded_key("dsp-k2", KEY_NOT_AFTER + 86_400)
K_OLD = seeded_key("dsp-expired", NOW - 1)
K_OTHER = seeded_key("dsp-untrusted", KEY_NOT_AFTER)
ALL_KEYS = (K1, K2, K_OLD, K_OTHER)


def key_json(key: SigningKey) -> dict[str, Any]:
    seed = key.private_key().private_bytes_raw()
    return {
        "kid": key.kid,
        "alg": "ed25519",
        "seed_hex": seed.hex(),
        "public_hex": key.public.public.hex(),
        "not_after": rfc3339(key.not_after),
    }


def make_draft(**changes: Any) -> EnvelopeDraft:
    base: dict[str, Any] = {
        "task_id": "tsk-0001",
        "collector_id": "col-alpha",
        "provider": "stub",
        "operation": "echo",
        "op_class": "read",
        "target_ref": "device:lab-sw-01",
        "idempotency_key": "idem-0001",
        "params": b'{"message":"hello"}',
        "not_before": NOT_BEFORE,
        "expires_at": EXPIRES_AT,
        "lease_epoch": 0,
    }
    base.update(changes)
    return EnvelopeDraft(**base)


def sign_draft(key: SigningKey = K1, **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(sign(make_draft(**changes), key))
    return obj


def make_context(**changes: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = {
        "collector_id": "col-alpha",
        "now": rfc3339(NOW),
        "trusted_kids": ["dsp-k1", "dsp-k2", "dsp-expired"],
        "seen_task_ids": [],
        "journal": {},
    }
    ctx.update(changes)
    return ctx


def canonical_hex(envelope: dict[str, Any] | str) -> str:
    raw = envelope if isinstance(envelope, str) else json.dumps(envelope, ensure_ascii=False)
    try:
        return wire.decode(raw).canonical.hex()
    except EnvelopeError:
        return ""


def make_case(
    name: str,
    description: str,
    envelope: dict[str, Any] | str,
    expect: dict[str, Any],
    **context: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "envelope": envelope,
        "canonical_hex": canonical_hex(envelope),
        "context": make_context(**context),
        "expect": expect,
    }


def expect_ok(**extra: Any) -> dict[str, Any]:
    return {"ok": True, **extra}


def expect_err(code: str) -> dict[str, Any]:
    return {"ok": False, "error": code}


def with_changes(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(obj)
    out.update(changes)
    return out


def without_field(obj: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in names}


def rewrite_raw(obj: dict[str, Any], transform: Callable[[str], str]) -> str:
    return transform(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


def flip_sig(obj: dict[str, Any]) -> dict[str, Any]:
    sig = bytearray(base64.b64decode(obj["sig"]))
    sig[0] ^= 0x01
    return with_changes(obj, sig=base64.b64encode(bytes(sig)).decode())
