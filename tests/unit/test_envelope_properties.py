"""Property tests: tampering always fails, encoding is injective, garbage never escapes as an exception."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from common.envelope import wire
from common.envelope.canonical import FIELD_ORDER, EnvelopeFields, canonical_bytes
from common.envelope.codes import EnvelopeError, Rejection
from common.envelope.sign import EnvelopeDraft, sign
from common.envelope.verify import VerifyContext, verify
from common.trust.keys import SigningKey

KEY = SigningKey.from_seed("dsp-prop", bytes(range(32)), 4_000_000_000)
NOW = 1_767_225_600

text = st.text(max_size=40)
safe_int = st.integers(min_value=0, max_value=wire.MAX_SAFE_INT)
op_class = st.sampled_from(["read", "mutate_reconcilable", "mutate_terminal"])


class _NoJournal:
    def lookup(self, idempotency_key: str) -> None:
        return None


@st.composite
def drafts(draw: st.DrawFn) -> EnvelopeDraft:
    not_before = draw(st.integers(min_value=0, max_value=NOW))
    return EnvelopeDraft(
        task_id=draw(text),
        collector_id=draw(text),
        provider=draw(text),
        operation=draw(text),
        op_class=draw(op_class),
        target_ref=draw(text),
        idempotency_key=draw(text),
        params=draw(st.binary(max_size=300)),
        not_before=not_before,
        expires_at=draw(st.integers(min_value=NOW, max_value=wire.MAX_SAFE_INT)),
        lease_epoch=draw(safe_int),
    )


def _ctx(draft: EnvelopeDraft) -> VerifyContext:
    return VerifyContext(
        collector_id=draft.collector_id,
        now=NOW,
        trusted_keys={KEY.kid: KEY.public},
        seen=set(),
        journal=_NoJournal(),
    )


def _mutated(value: Any, data: st.DataObject) -> Any:
    if isinstance(value, str):
        return data.draw(text.filter(lambda v: v != value))
    return data.draw(safe_int.filter(lambda v: v != value))


@settings(max_examples=200, deadline=None)
@given(drafts())
def test_signed_envelopes_verify(draft: EnvelopeDraft) -> None:
    accepted = verify(sign(draft, KEY), _ctx(draft))
    assert accepted.envelope.params == draft.params
    assert accepted.envelope.fields.lease_epoch == draft.lease_epoch


SIGNED_WIRE_FIELDS = [name for name in FIELD_ORDER if name != "params_sha256"]


@settings(max_examples=300, deadline=None)
@given(drafts(), st.sampled_from(SIGNED_WIRE_FIELDS), st.data())
def test_changing_any_signed_field_fails(draft: EnvelopeDraft, field: str, data: st.DataObject) -> None:
    obj = json.loads(sign(draft, KEY))
    obj[field] = _mutated(obj[field], data)
    if field == "op_class":
        obj[field] = data.draw(op_class.filter(lambda v: v != draft.op_class))
    try:
        verify(json.dumps(obj, ensure_ascii=False), _ctx(draft))
    except EnvelopeError as exc:
        # A changed kid is untrusted; a changed window may be malformed. Nothing verifies.
        assert exc.code in {Rejection.BAD_SIGNATURE, Rejection.MALFORMED, Rejection.UNKNOWN_KID}
    else:
        raise AssertionError(f"changing {field} was not detected")


@settings(max_examples=200, deadline=None)
@given(drafts().filter(lambda d: len(d.params) > 0), st.data())
def test_changing_any_params_byte_fails(draft: EnvelopeDraft, data: st.DataObject) -> None:
    obj = json.loads(sign(draft, KEY))
    params = bytearray(draft.params)
    index = data.draw(st.integers(min_value=0, max_value=len(params) - 1))
    params[index] ^= data.draw(st.integers(min_value=1, max_value=255))
    obj["params"] = base64.b64encode(bytes(params)).decode()
    try:
        verify(json.dumps(obj), _ctx(draft))
    except EnvelopeError as exc:
        assert exc.code is Rejection.PARAMS_HASH_MISMATCH
    else:
        raise AssertionError("changed params were accepted")


fields_strategy = st.builds(
    EnvelopeFields,
    kid=text,
    task_id=text,
    collector_id=text,
    provider=text,
    operation=text,
    op_class=text,
    target_ref=text,
    idempotency_key=text,
    params_sha256=st.binary(min_size=32, max_size=32),
    not_before=safe_int,
    expires_at=safe_int,
    lease_epoch=safe_int,
)


@settings(max_examples=500, deadline=None)
@given(fields_strategy, fields_strategy)
def test_canonical_encoding_is_injective(a: EnvelopeFields, b: EnvelopeFields) -> None:
    assert (canonical_bytes(a) == canonical_bytes(b)) == (a == b)


def test_shifting_characters_between_fields_changes_the_bytes() -> None:
    base = EnvelopeFields("k", "ab", "c", "p", "o", "read", "t", "i", b"\x00" * 32, 1, 2, 3)
    shifted = base._replace(task_id="a", collector_id="bc")
    assert canonical_bytes(base) != canonical_bytes(shifted)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400)))
def test_arbitrary_bytes_never_escape_as_exceptions(raw: bytes | str) -> None:
    try:
        wire.decode(raw)
    except EnvelopeError as exc:
        assert isinstance(exc.code, Rejection)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from([*wire.WIRE_KEYS, "extra"]), json_values, max_size=16))
def test_arbitrary_json_objects_never_escape_as_exceptions(obj: dict[str, Any]) -> None:
    try:
        raw = json.dumps(obj)
    except ValueError:
        return
    try:
        wire.decode(raw)
    except EnvelopeError as exc:
        assert isinstance(exc.code, Rejection)


@settings(max_examples=300, deadline=None)
@given(drafts(), st.data())
def test_mangled_members_of_a_signed_envelope_give_a_stable_code(
    draft: EnvelopeDraft, data: st.DataObject
) -> None:
    obj = json.loads(sign(draft, KEY))
    key = data.draw(st.sampled_from(sorted(obj)))
    obj[key] = data.draw(json_values)
    try:
        verify(json.dumps(obj), _ctx(draft))
    except EnvelopeError as exc:
        assert isinstance(exc.code, Rejection)
