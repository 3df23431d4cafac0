"""Regenerate vectors/envelope/*.json deterministically.

    python -m tools.gen_envelope_vectors          # rewrite the files
    python -m tools.gen_envelope_vectors --check  # exit 1 if the committed files differ

Keys come from fixed seeds and Ed25519 signatures are deterministic, so the
output is identical on every run. Each case's ``canonical_hex`` is what a
verifier computes from the case's envelope ("" when the envelope cannot be
decoded); see vectors/envelope/README.md.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.envelope import wire
from common.envelope.canonical import MAX_PARAMS_BYTES, MAX_TEXT_BYTES
from common.envelope.codes import EnvelopeError
from common.envelope.sign import EnvelopeDraft, sign
from common.keys import SigningKey, rfc3339

OUT_DIR = Path(__file__).resolve().parent.parent / "vectors" / "envelope"
FORMAT = "versus-envelope-vectors/1"

NOW = 1_767_225_600  # 2026-01-01T00:00:00Z
NOT_BEFORE = NOW - 60
EXPIRES_AT = NOW + 240
KEY_NOT_AFTER = NOW + 365 * 86_400


def _key(label: str, not_after: int) -> SigningKey:
    seed = hashlib.sha256(f"versus-envelope-vector-key/{label}".encode()).digest()
    return SigningKey.from_seed(label, seed, not_after)


K1 = _key("dsp-k1", KEY_NOT_AFTER)
K2 = _key("dsp-k2", KEY_NOT_AFTER + 86_400)
K_OLD = _key("dsp-expired", NOW - 1)
K_OTHER = _key("dsp-untrusted", KEY_NOT_AFTER)
ALL_KEYS = (K1, K2, K_OLD, K_OTHER)


def _key_json(key: SigningKey) -> dict[str, Any]:
    seed = key.private_key().private_bytes_raw()
    return {
        "kid": key.kid,
        "alg": "ed25519",
        "seed_hex": seed.hex(),
        "public_hex": key.public.public.hex(),
        "not_after": rfc3339(key.not_after),
    }


def _draft(**changes: Any) -> EnvelopeDraft:
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


def _signed(key: SigningKey = K1, **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(sign(_draft(**changes), key))
    return obj


def _context(**changes: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = {
        "collector_id": "col-alpha",
        "now": rfc3339(NOW),
        "trusted_kids": ["dsp-k1", "dsp-k2", "dsp-expired"],
        "seen_task_ids": [],
        "journal": {},
    }
    ctx.update(changes)
    return ctx


def _canonical_hex(envelope: dict[str, Any] | str) -> str:
    raw = envelope if isinstance(envelope, str) else json.dumps(envelope, ensure_ascii=False)
    try:
        return wire.decode(raw).canonical.hex()
    except EnvelopeError:
        return ""


def _case(
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
        "canonical_hex": _canonical_hex(envelope),
        "context": _context(**context),
        "expect": expect,
    }


def _ok(**extra: Any) -> dict[str, Any]:
    return {"ok": True, **extra}


def _err(code: str) -> dict[str, Any]:
    return {"ok": False, "error": code}


def _with(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(obj)
    out.update(changes)
    return out


def _without(obj: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in names}


def _raw(obj: dict[str, Any], transform: Callable[[str], str]) -> str:
    return transform(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


def _flip_sig(obj: dict[str, Any]) -> dict[str, Any]:
    sig = bytearray(base64.b64decode(obj["sig"]))
    sig[0] ^= 0x01
    return _with(obj, sig=base64.b64encode(bytes(sig)).decode())


def valid_cases() -> list[dict[str, Any]]:
    base = _signed()
    absent = _signed(target_ref="", idempotency_key="", params=b"", lease_epoch=0)
    return [
        _case("valid_read", "A read envelope, every field present.", base, _ok()),
        _case(
            "valid_absent_fields",
            "target_ref, idempotency_key, params and lease_epoch left out: encoded exactly like empty/0.",
            _without(absent, "target_ref", "idempotency_key", "params", "lease_epoch"),
            _ok(),
        ),
        _case(
            "valid_empty_fields",
            "The same envelope with the fields present but empty; canonical bytes equal valid_absent_fields.",
            absent,
            _ok(),
        ),
        _case(
            "valid_non_ascii",
            "Non-ASCII text is signed as its UTF-8 bytes, without normalisation.",
            _signed(
                provider="ADCProvider/f5-big-ip", target_ref="routeur-é-東京-🚀", idempotency_key="clé-Ω"
            ),
            _ok(),
        ),
        _case(
            "valid_large_params",
            "64 KiB of binary params; only their SHA-256 is in the canonical bytes.",
            _signed(params=bytes(range(256)) * 256, op_class="mutate_reconcilable", lease_epoch=42),
            _ok(),
        ),
        _case(
            "valid_mutate_max_epoch",
            "A terminal mutation carrying the largest lease epoch allowed (2^53 - 1).",
            _signed(op_class="mutate_terminal", lease_epoch=wire.MAX_SAFE_INT),
            _ok(),
        ),
        _case(
            "valid_text_at_limit",
            f"target_ref of exactly {MAX_TEXT_BYTES} UTF-8 bytes.",
            _signed(target_ref="t" * MAX_TEXT_BYTES),
            _ok(),
        ),
        _case(
            "valid_second_kid",
            "Signed with dsp-k2 while dsp-k1 is also trusted.",
            _signed(K2),
            _ok(),
        ),
        _case(
            "valid_rotation_overlap",
            "Signed with the older dsp-k1 after rotation to dsp-k2; both still trusted.",
            _signed(K1, task_id="tsk-0002"),
            _ok(),
            trusted_kids=["dsp-k2", "dsp-k1"],
        ),
        _case(
            "valid_integer_spelled_as_float",
            "Integers are JSON numbers with an integral value, however spelled.",
            _raw(base, lambda t: t.replace(f'"not_before":{NOT_BEFORE}', f'"not_before":{NOT_BEFORE}.0')),
            _ok(),
        ),
        _case(
            "journaled_idempotency_key",
            "A retry (new task_id) whose idempotency key is journaled: return the journaled result.",
            _signed(task_id="tsk-0003"),
            _ok(journaled={"status": "success", "result_b64": "b2s="}),
            journal={"idem-0001": {"status": "success", "result_b64": "b2s="}},
        ),
        _case(
            "skew_not_before_inside",
            "now is exactly not_before - 30 s (the skew allowance): accepted.",
            base,
            _ok(),
            now=rfc3339(NOT_BEFORE - 30),
        ),
        _case(
            "skew_expires_at_inside",
            "now is exactly expires_at + 30 s: accepted.",
            base,
            _ok(),
            now=rfc3339(EXPIRES_AT + 30),
        ),
    ]


def rule_cases() -> list[dict[str, Any]]:
    base = _signed()
    return [
        _case(
            "unknown_kid",
            "Signed by a key the collector does not trust.",
            _signed(K_OTHER),
            _err("unknown_kid"),
        ),
        _case(
            "absent_kid",
            "No kid at all encodes as the empty kid, which is not trusted.",
            _without(base, "kid"),
            _err("unknown_kid"),
        ),
        _case(
            "kid_expired",
            "Signed by a trusted key whose not_after has passed.",
            _signed(K_OLD),
            _err("kid_expired"),
        ),
        _case(
            "bad_signature_flipped",
            "One bit of the signature flipped.",
            _flip_sig(base),
            _err("bad_signature"),
        ),
        _case(
            "bad_signature_target_changed",
            "target_ref altered after signing.",
            _with(base, target_ref="device:core-rtr-01"),
            _err("bad_signature"),
        ),
        _case(
            "bad_signature_epoch_changed",
            "lease_epoch altered after signing.",
            _with(base, lease_epoch=1),
            _err("bad_signature"),
        ),
        _case(
            "bad_signature_op_class_changed",
            "op_class downgraded after signing.",
            _with(_signed(op_class="mutate_terminal"), op_class="read"),
            _err("bad_signature"),
        ),
        _case(
            "bad_signature_hash_changed",
            "params and params_sha256 both replaced after signing.",
            _with(
                base, params=base64.b64encode(b"{}").decode(), params_sha256=hashlib.sha256(b"{}").hexdigest()
            ),
            _err("bad_signature"),
        ),
        _case(
            "bad_signature_wrong_key",
            "Signed by dsp-k2 but labelled dsp-k1.",
            _with(_signed(K2), kid="dsp-k1"),
            _err("bad_signature"),
        ),
        _case(
            "bad_signature_expiry_extended",
            "expires_at pushed out after signing.",
            _with(base, expires_at=EXPIRES_AT + 3600),
            _err("bad_signature"),
        ),
        _case(
            "wrong_collector",
            "Validly signed for another collector.",
            _signed(collector_id="col-beta"),
            _err("wrong_collector"),
        ),
        _case(
            "not_yet_valid",
            "now is well before not_before.",
            base,
            _err("not_yet_valid"),
            now=rfc3339(NOT_BEFORE - 600),
        ),
        _case(
            "skew_not_before_outside",
            "now is not_before - 31 s: one second past the allowance.",
            base,
            _err("not_yet_valid"),
            now=rfc3339(NOT_BEFORE - 31),
        ),
        _case(
            "expired", "now is well after expires_at.", base, _err("expired"), now=rfc3339(EXPIRES_AT + 600)
        ),
        _case(
            "skew_expires_at_outside",
            "now is expires_at + 31 s.",
            base,
            _err("expired"),
            now=rfc3339(EXPIRES_AT + 31),
        ),
        _case(
            "params_hash_mismatch",
            "params replaced after signing; params_sha256 left as signed.",
            _with(base, params=base64.b64encode(b'{"message":"bye"}').decode()),
            _err("params_hash_mismatch"),
        ),
        _case(
            "params_absent_hash_mismatch",
            "params dropped after signing.",
            _without(base, "params"),
            _err("params_hash_mismatch"),
        ),
        _case(
            "replayed_task",
            "A task_id the collector has already received.",
            base,
            _err("replayed_task"),
            seen_task_ids=["tsk-0001"],
        ),
        _case(
            "replay_beats_journal",
            "A replayed task_id is refused even if its key is journaled.",
            base,
            _err("replayed_task"),
            seen_task_ids=["tsk-0001"],
            journal={"idem-0001": {"status": "success"}},
        ),
        _case(
            "wrong_collector_before_expiry",
            "Rules apply in order: wrong collector is reported before expiry.",
            _signed(collector_id="col-beta"),
            _err("wrong_collector"),
            now=rfc3339(EXPIRES_AT + 600),
        ),
    ]


def malformed_cases() -> list[dict[str, Any]]:
    base = _signed()
    sig = base64.b64decode(base["sig"])
    digest = bytes.fromhex(base["params_sha256"])
    malformed, encoding, length = (
        _err("envelope_malformed"),
        _err("envelope_bad_encoding"),
        _err("envelope_bad_length"),
    )
    dump = json.dumps(base, ensure_ascii=False, separators=(",", ":"))
    return [
        _case("not_json", "Not JSON at all.", "this is not json", malformed),
        _case("truncated_json", "The wire text cut short.", dump[: len(dump) // 2], malformed),
        _case("json_array", "A JSON array instead of an object.", "[]", malformed),
        _case("json_string", "A JSON string instead of an object.", '"envelope"', malformed),
        _case(
            "duplicate_key",
            "collector_id appears twice.",
            _raw(base, lambda t: t[:-1] + ',"collector_id":"col-alpha"}'),
            malformed,
        ),
        _case("unknown_field", "A field this version does not define.", _with(base, priority=1), malformed),
        _case("text_wrong_type", "task_id is a number.", _with(base, task_id=1), malformed),
        _case(
            "text_null",
            "target_ref is null (absent is allowed, null is not).",
            _with(base, target_ref=None),
            malformed,
        ),
        _case(
            "text_too_long",
            f"idempotency_key of {MAX_TEXT_BYTES + 1} bytes.",
            _with(base, idempotency_key="k" * (MAX_TEXT_BYTES + 1)),
            malformed,
        ),
        _case(
            "text_lone_surrogate",
            "A text field holding an unpaired UTF-16 surrogate.",
            _raw(base, lambda t: t.replace('"target_ref":"device:lab-sw-01"', '"target_ref":"dev\\ud800"')),
            malformed,
        ),
        _case(
            "op_class_unknown",
            "op_class outside the three classes.",
            _with(base, op_class="write"),
            malformed,
        ),
        _case("int_negative", "lease_epoch below zero.", _with(base, lease_epoch=-1), malformed),
        _case(
            "int_fraction",
            "not_before with a fractional part.",
            _raw(base, lambda t: t.replace(f'"not_before":{NOT_BEFORE}', f'"not_before":{NOT_BEFORE}.5')),
            malformed,
        ),
        _case(
            "int_too_large",
            "lease_epoch above 2^53 - 1.",
            _with(base, lease_epoch=wire.MAX_SAFE_INT + 1),
            malformed,
        ),
        _case("int_as_string", "expires_at as a string.", _with(base, expires_at=str(EXPIRES_AT)), malformed),
        _case("int_as_bool", "lease_epoch as true.", _with(base, lease_epoch=True), malformed),
        _case(
            "window_inverted",
            "not_before after expires_at.",
            _with(base, not_before=EXPIRES_AT + 1),
            malformed,
        ),
        _case(
            "sig_not_base64",
            "sig with characters outside the base64 alphabet.",
            _with(base, sig="!" + base["sig"][1:]),
            encoding,
        ),
        _case(
            "sig_base64url",
            "sig in the URL-safe alphabet instead of standard base64.",
            _with(base, sig=base64.urlsafe_b64encode(b"\xfb" * 64).decode()),
            encoding,
        ),
        _case(
            "sig_missing_padding",
            "sig without its '=' padding.",
            _with(base, sig=base["sig"].rstrip("=")),
            encoding,
        ),
        _case(
            "params_noncanonical_base64",
            "params whose last quantum has non-zero unused bits ('QR==' for 'A').",
            _with(base, params="QR=="),
            encoding,
        ),
        _case(
            "hash_uppercase_hex",
            "params_sha256 in upper case.",
            _with(base, params_sha256=base["params_sha256"].upper()),
            encoding,
        ),
        _case(
            "hash_odd_length",
            "params_sha256 with an odd number of hex digits.",
            _with(base, params_sha256=base["params_sha256"][:-1]),
            encoding,
        ),
        _case(
            "sig_truncated", "sig of 63 bytes.", _with(base, sig=base64.b64encode(sig[:-1]).decode()), length
        ),
        _case(
            "sig_absent", "No sig: the empty signature has the wrong length.", _without(base, "sig"), length
        ),
        _case(
            "hash_truncated",
            "params_sha256 of 31 bytes.",
            _with(base, params_sha256=digest[:-1].hex()),
            length,
        ),
    ]


def limit_cases() -> list[dict[str, Any]]:
    base = _signed()
    return [
        _case(
            "params_too_large",
            f"params of {MAX_PARAMS_BYTES + 3} bytes (limit {MAX_PARAMS_BYTES}).",
            _with(base, params=base64.b64encode(b"\x00" * (MAX_PARAMS_BYTES + 3)).decode()),
            _err("params_too_large"),
        ),
        _case(
            "envelope_too_large",
            f"Wire text over {wire.MAX_WIRE_BYTES} bytes.",
            _with(base, target_ref="x" * (wire.MAX_WIRE_BYTES + 1)),
            _err("envelope_too_large"),
        ),
    ]


def documents() -> dict[str, dict[str, Any]]:
    keys = [_key_json(k) for k in ALL_KEYS]
    return {
        "v1-valid.json": {"format": FORMAT, "keys": keys, "cases": valid_cases()},
        "v1-rules.json": {"format": FORMAT, "keys": keys, "cases": rule_cases()},
        "v1-malformed.json": {"format": FORMAT, "keys": keys, "cases": malformed_cases()},
        "v1-limits.json": {"format": FORMAT, "keys": keys, "cases": limit_cases()},
    }


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    for name, doc in documents().items():
        path = OUT_DIR / name
        text = render(doc)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale vectors: {', '.join(stale)}; run python -m tools.gen_envelope_vectors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
