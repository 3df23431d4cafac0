"""The envelope vector cases, by file: valid envelopes, the verifier's rules in order, malformed
wire forms and the size limits (tools/gen_envelope_vectors.py writes them)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from common.envelope import wire
from common.envelope.canonical import MAX_PARAMS_BYTES, MAX_TEXT_BYTES
from common.trust.keys import rfc3339
from tools.envelope_case_kit import (
    EXPIRES_AT,
    K1,
    K2,
    K_OLD,
    K_OTHER,
    NOT_BEFORE,
    expect_err,
    expect_ok,
    flip_sig,
    make_case,
    rewrite_raw,
    sign_draft,
    with_changes,
    without_field,
)


def valid_cases() -> list[dict[str, Any]]:
    base = sign_draft()
    absent = sign_draft(target_ref="", idempotency_key="", params=b"", lease_epoch=0)
    return [
        make_case("valid_read", "A read envelope, every field present.", base, expect_ok()),
        make_case(
            "valid_absent_fields",
            "target_ref, idempotency_key, params and lease_epoch left out: encoded exactly like empty/0.",
            without_field(absent, "target_ref", "idempotency_key", "params", "lease_epoch"),
            expect_ok(),
        ),
        make_case(
            "valid_empty_fields",
            "The same envelope with the fields present but empty; canonical bytes equal valid_absent_fields.",
            absent,
            expect_ok(),
        ),
        make_case(
            "valid_non_ascii",
            "Non-ASCII text is signed as its UTF-8 bytes, without normalisation.",
            sign_draft(
                provider="ADCProvider/f5-big-ip", target_ref="routeur-é-東京-🚀", idempotency_key="clé-Ω"
            ),
            expect_ok(),
        ),
        make_case(
            "valid_large_params",
            "64 KiB of binary params; only their SHA-256 is in the canonical bytes.",
            sign_draft(params=bytes(range(256)) * 256, op_class="mutate_reconcilable", lease_epoch=42),
            expect_ok(),
        ),
        make_case(
            "valid_mutate_max_epoch",
            "A terminal mutation carrying the largest lease epoch allowed (2^53 - 1).",
            sign_draft(op_class="mutate_terminal", lease_epoch=wire.MAX_SAFE_INT),
            expect_ok(),
        ),
        make_case(
            "valid_text_at_limit",
            f"target_ref of exactly {MAX_TEXT_BYTES} UTF-8 bytes.",
            sign_draft(target_ref="t" * MAX_TEXT_BYTES),
            expect_ok(),
        ),
        make_case(
            "valid_second_kid",
            "Signed with dsp-k2 while dsp-k1 is also trusted.",
            sign_draft(K2),
            expect_ok(),
        ),
        make_case(
            "valid_rotation_overlap",
            "Signed with the older dsp-k1 after rotation to dsp-k2; both still trusted.",
            sign_draft(K1, task_id="tsk-0002"),
            expect_ok(),
            trusted_kids=["dsp-k2", "dsp-k1"],
        ),
        make_case(
            "valid_integer_spelled_as_float",
            "Integers are JSON numbers with an integral value, however spelled.",
            rewrite_raw(
                base,
                lambda t: t.replace(f'"not_before":{NOT_BEFORE}', f'"not_before":{NOT_BEFORE}.0'),
            ),
            expect_ok(),
        ),
        make_case(
            "journaled_idempotency_key",
            "A retry (new task_id) whose idempotency key is journaled: return the journaled result.",
            sign_draft(task_id="tsk-0003"),
            expect_ok(journaled={"status": "success", "result_b64": "b2s="}),
            journal={"idem-0001": {"status": "success", "result_b64": "b2s="}},
        ),
        make_case(
            "skew_not_before_inside",
            "now is exactly not_before - 30 s (the skew allowance): accepted.",
            base,
            expect_ok(),
            now=rfc3339(NOT_BEFORE - 30),
        ),
        make_case(
            "skew_expires_at_inside",
            "now is exactly expires_at + 30 s: accepted.",
            base,
            expect_ok(),
            now=rfc3339(EXPIRES_AT + 30),
        ),
    ]


def rule_cases() -> list[dict[str, Any]]:
    base = sign_draft()
    return [
        make_case(
            "unknown_kid",
            "Signed by a key the collector does not trust.",
            sign_draft(K_OTHER),
            expect_err("unknown_kid"),
        ),
        make_case(
            "absent_kid",
            "No kid at all encodes as the empty kid, which is not trusted.",
            without_field(base, "kid"),
            expect_err("unknown_kid"),
        ),
        make_case(
            "kid_expired",
            "Signed by a trusted key whose not_after has passed.",
            sign_draft(K_OLD),
            expect_err("kid_expired"),
        ),
        make_case(
            "bad_signature_flipped",
            "One bit of the signature flipped.",
            flip_sig(base),
            expect_err("bad_signature"),
        ),
        make_case(
            "bad_signature_target_changed",
            "target_ref altered after signing.",
            with_changes(base, target_ref="device:core-rtr-01"),
            expect_err("bad_signature"),
        ),
        make_case(
            "bad_signature_epoch_changed",
            "lease_epoch altered after signing.",
            with_changes(base, lease_epoch=1),
            expect_err("bad_signature"),
        ),
        make_case(
            "bad_signature_op_class_changed",
            "op_class downgraded after signing.",
            with_changes(sign_draft(op_class="mutate_terminal"), op_class="read"),
            expect_err("bad_signature"),
        ),
        make_case(
            "bad_signature_hash_changed",
            "params and params_sha256 both replaced after signing.",
            with_changes(
                base, params=base64.b64encode(b"{}").decode(), params_sha256=hashlib.sha256(b"{}").hexdigest()
            ),
            expect_err("bad_signature"),
        ),
        make_case(
            "bad_signature_wrong_key",
            "Signed by dsp-k2 but labelled dsp-k1.",
            with_changes(sign_draft(K2), kid="dsp-k1"),
            expect_err("bad_signature"),
        ),
        make_case(
            "bad_signature_expiry_extended",
            "expires_at pushed out after signing.",
            with_changes(base, expires_at=EXPIRES_AT + 3600),
            expect_err("bad_signature"),
        ),
        make_case(
            "wrong_collector",
            "Validly signed for another collector.",
            sign_draft(collector_id="col-beta"),
            expect_err("wrong_collector"),
        ),
        make_case(
            "not_yet_valid",
            "now is well before not_before.",
            base,
            expect_err("not_yet_valid"),
            now=rfc3339(NOT_BEFORE - 600),
        ),
        make_case(
            "skew_not_before_outside",
            "now is not_before - 31 s: one second past the allowance.",
            base,
            expect_err("not_yet_valid"),
            now=rfc3339(NOT_BEFORE - 31),
        ),
        make_case(
            "expired",
            "now is well after expires_at.",
            base,
            expect_err("expired"),
            now=rfc3339(EXPIRES_AT + 600),
        ),
        make_case(
            "skew_expires_at_outside",
            "now is expires_at + 31 s.",
            base,
            expect_err("expired"),
            now=rfc3339(EXPIRES_AT + 31),
        ),
        make_case(
            "params_hash_mismatch",
            "params replaced after signing; params_sha256 left as signed.",
            with_changes(base, params=base64.b64encode(b'{"message":"bye"}').decode()),
            expect_err("params_hash_mismatch"),
        ),
        make_case(
            "params_absent_hash_mismatch",
            "params dropped after signing.",
            without_field(base, "params"),
            expect_err("params_hash_mismatch"),
        ),
        make_case(
            "replayed_task",
            "A task_id the collector has already received.",
            base,
            expect_err("replayed_task"),
            seen_task_ids=["tsk-0001"],
        ),
        make_case(
            "replay_beats_journal",
            "A replayed task_id is refused even if its key is journaled.",
            base,
            expect_err("replayed_task"),
            seen_task_ids=["tsk-0001"],
            journal={"idem-0001": {"status": "success"}},
        ),
        make_case(
            "wrong_collector_before_expiry",
            "Rules apply in order: wrong collector is reported before expiry.",
            sign_draft(collector_id="col-beta"),
            expect_err("wrong_collector"),
            now=rfc3339(EXPIRES_AT + 600),
        ),
    ]


def malformed_cases() -> list[dict[str, Any]]:
    base = sign_draft()
    sig = base64.b64decode(base["sig"])
    digest = bytes.fromhex(base["params_sha256"])
    malformed, encoding, length = (
        expect_err("envelope_malformed"),
        expect_err("envelope_bad_encoding"),
        expect_err("envelope_bad_length"),
    )
    dump = json.dumps(base, ensure_ascii=False, separators=(",", ":"))
    return [
        make_case("not_json", "Not JSON at all.", "this is not json", malformed),
        make_case("truncated_json", "The wire text cut short.", dump[: len(dump) // 2], malformed),
        make_case("json_array", "A JSON array instead of an object.", "[]", malformed),
        make_case("json_string", "A JSON string instead of an object.", '"envelope"', malformed),
        make_case(
            "duplicate_key",
            "collector_id appears twice.",
            rewrite_raw(base, lambda t: t[:-1] + ',"collector_id":"col-alpha"}'),
            malformed,
        ),
        make_case(
            "unknown_field",
            "A field this version does not define.",
            with_changes(base, priority=1),
            malformed,
        ),
        make_case("text_wrong_type", "task_id is a number.", with_changes(base, task_id=1), malformed),
        make_case(
            "text_null",
            "target_ref is null (absent is allowed, null is not).",
            with_changes(base, target_ref=None),
            malformed,
        ),
        make_case(
            "text_too_long",
            f"idempotency_key of {MAX_TEXT_BYTES + 1} bytes.",
            with_changes(base, idempotency_key="k" * (MAX_TEXT_BYTES + 1)),
            malformed,
        ),
        make_case(
            "text_lone_surrogate",
            "A text field holding an unpaired UTF-16 surrogate.",
            rewrite_raw(
                base, lambda t: t.replace('"target_ref":"device:lab-sw-01"', '"target_ref":"dev\\ud800"')
            ),
            malformed,
        ),
        make_case(
            "op_class_unknown",
            "op_class outside the three classes.",
            with_changes(base, op_class="write"),
            malformed,
        ),
        make_case("int_negative", "lease_epoch below zero.", with_changes(base, lease_epoch=-1), malformed),
        make_case(
            "int_fraction",
            "not_before with a fractional part.",
            rewrite_raw(
                base,
                lambda t: t.replace(f'"not_before":{NOT_BEFORE}', f'"not_before":{NOT_BEFORE}.5'),
            ),
            malformed,
        ),
        make_case(
            "int_too_large",
            "lease_epoch above 2^53 - 1.",
            with_changes(base, lease_epoch=wire.MAX_SAFE_INT + 1),
            malformed,
        ),
        make_case(
            "int_as_string",
            "expires_at as a string.",
            with_changes(base, expires_at=str(EXPIRES_AT)),
            malformed,
        ),
        make_case("int_as_bool", "lease_epoch as true.", with_changes(base, lease_epoch=True), malformed),
        make_case(
            "window_inverted",
            "not_before after expires_at.",
            with_changes(base, not_before=EXPIRES_AT + 1),
            malformed,
        ),
        make_case(
            "sig_not_base64",
            "sig with characters outside the base64 alphabet.",
            with_changes(base, sig="!" + base["sig"][1:]),
            encoding,
        ),
        make_case(
            "sig_base64url",
            "sig in the URL-safe alphabet instead of standard base64.",
            with_changes(base, sig=base64.urlsafe_b64encode(b"\xfb" * 64).decode()),
            encoding,
        ),
        make_case(
            "sig_missing_padding",
            "sig without its '=' padding.",
            with_changes(base, sig=base["sig"].rstrip("=")),
            encoding,
        ),
        make_case(
            "params_noncanonical_base64",
            "params whose last quantum has non-zero unused bits ('QR==' for 'A').",
            with_changes(base, params="QR=="),
            encoding,
        ),
        make_case(
            "hash_uppercase_hex",
            "params_sha256 in upper case.",
            with_changes(base, params_sha256=base["params_sha256"].upper()),
            encoding,
        ),
        make_case(
            "hash_odd_length",
            "params_sha256 with an odd number of hex digits.",
            with_changes(base, params_sha256=base["params_sha256"][:-1]),
            encoding,
        ),
        make_case(
            "sig_truncated",
            "sig of 63 bytes.",
            with_changes(base, sig=base64.b64encode(sig[:-1]).decode()),
            length,
        ),
        make_case(
            "sig_absent",
            "No sig: the empty signature has the wrong length.",
            without_field(base, "sig"),
            length,
        ),
        make_case(
            "hash_truncated",
            "params_sha256 of 31 bytes.",
            with_changes(base, params_sha256=digest[:-1].hex()),
            length,
        ),
    ]


def limit_cases() -> list[dict[str, Any]]:
    base = sign_draft()
    return [
        make_case(
            "params_too_large",
            f"params of {MAX_PARAMS_BYTES + 3} bytes (limit {MAX_PARAMS_BYTES}).",
            with_changes(base, params=base64.b64encode(b"\x00" * (MAX_PARAMS_BYTES + 3)).decode()),
            expect_err("params_too_large"),
        ),
        make_case(
            "envelope_too_large",
            f"Wire text over {wire.MAX_WIRE_BYTES} bytes.",
            with_changes(base, target_ref="x" * (wire.MAX_WIRE_BYTES + 1)),
            expect_err("envelope_too_large"),
        ),
    ]
