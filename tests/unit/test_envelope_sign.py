from __future__ import annotations

import dataclasses
import json

import pytest

from common.envelope import wire
from common.envelope.canonical import MAX_PARAMS_BYTES, MAX_TEXT_BYTES, canonical_bytes
from common.envelope.sign import EnvelopeDraft, sign
from common.envelope.verify import ServerClock
from common.trust.keys import SigningKey

KEY = SigningKey.from_seed("dsp-s", b"\x02" * 32, 4_000_000_000)
DRAFT = EnvelopeDraft("t-1", "col-1", "stub", "echo", "read", "dev", "idem", b"{}", 100, 200, 5)


def test_wire_form_round_trips() -> None:
    raw = sign(DRAFT, KEY)
    env = wire.decode(raw)
    assert env.params == b"{}"
    assert env.fields.kid == "dsp-s"
    assert env.canonical == canonical_bytes(env.fields)
    assert KEY.public.verify(env.signature, env.canonical)
    assert list(json.loads(raw)) == list(wire.WIRE_KEYS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"target_ref": "x" * (MAX_TEXT_BYTES + 1)}, "target_ref"),
        ({"task_id": "é" * (MAX_TEXT_BYTES // 2 + 1)}, "task_id exceeds"),
        ({"op_class": "write"}, "op_class"),
        ({"params": b"\x00" * (MAX_PARAMS_BYTES + 1)}, "params exceed"),
        ({"not_before": 300}, "not_before <= expires_at"),
        ({"lease_epoch": -1}, "lease_epoch"),
        ({"expires_at": wire.MAX_SAFE_INT + 1}, r"2\^53-1"),
    ],
)
def test_sign_refuses_drafts_no_verifier_accepts(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sign(dataclasses.replace(DRAFT, **change), KEY)  # type: ignore[arg-type]


def test_text_at_the_limit_is_signed() -> None:
    raw = sign(dataclasses.replace(DRAFT, target_ref="é" * (MAX_TEXT_BYTES // 2)), KEY)
    assert len(wire.decode(raw).fields.target_ref.encode()) == MAX_TEXT_BYTES


def test_server_clock_corrects_by_observed_offset() -> None:
    clock = ServerClock.observe(server_time_s=1000.0, local_time_s=940.5)
    assert clock.now(950.0) == 1009
    assert ServerClock().now(12.9) == 12
