"""The conformance vectors in vectors/envelope/ are the source of truth; these tests only read them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from common.envelope import wire
from common.envelope.codes import EnvelopeError, Rejection
from common.envelope.verify import VerifyContext, verify
from common.trust.keys import PublicKey, parse_rfc3339

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "envelope"
FILES = sorted(VECTORS.glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    assert doc["format"] == "versus-envelope-vectors/1"
    return doc


CASES = [(path.name, doc, case) for path in FILES for doc in [_load(path)] for case in doc["cases"]]


def _wire_bytes(envelope: Mapping[str, Any] | str) -> bytes:
    if isinstance(envelope, str):
        return envelope.encode("utf-8", "surrogatepass")
    return json.dumps(envelope, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _keys(doc: Mapping[str, Any]) -> dict[str, PublicKey]:
    return {
        k["kid"]: PublicKey(
            kid=k["kid"], public=bytes.fromhex(k["public_hex"]), not_after=parse_rfc3339(k["not_after"])
        )
        for k in doc["keys"]
    }


class _Journal:
    def __init__(self, entries: Mapping[str, Mapping[str, Any]]):
        self.entries = entries

    def lookup(self, idempotency_key: str) -> Mapping[str, Any] | None:
        return self.entries.get(idempotency_key)


def _context(doc: Mapping[str, Any], ctx: Mapping[str, Any]) -> VerifyContext:
    keys = _keys(doc)
    return VerifyContext(
        collector_id=ctx["collector_id"],
        now=parse_rfc3339(ctx["now"]),
        trusted_keys={kid: keys[kid] for kid in ctx["trusted_kids"]},
        seen=set(ctx["seen_task_ids"]),
        journal=_Journal(ctx["journal"]),
    )


def test_vector_files_exist_and_cover_every_rule() -> None:
    assert FILES, "no vector files"
    codes = {case["expect"].get("error") for _, _, case in CASES}
    assert {r.value for r in Rejection} <= codes
    assert any(case["expect"].get("journaled") for _, _, case in CASES)
    names = [case["name"] for _, _, case in CASES]
    assert len(names) == len(set(names)), "case names must be unique"


@pytest.mark.parametrize(("file", "doc", "case"), CASES, ids=[f"{f}:{c['name']}" for f, _, c in CASES])
def test_verifier_agrees_with_vector(file: str, doc: dict[str, Any], case: dict[str, Any]) -> None:
    raw = _wire_bytes(case["envelope"])
    expect = case["expect"]
    try:
        accepted = verify(raw, _context(doc, case["context"]))
    except EnvelopeError as exc:
        assert not expect["ok"], f"refused with {exc.code.value}: {exc.message}"
        assert exc.code.value == expect["error"]
        return
    assert expect["ok"], f"accepted, expected {expect.get('error')}"
    journaled = accepted.journaled
    assert (dict(journaled) if journaled is not None else None) == expect.get("journaled")


@pytest.mark.parametrize(("file", "doc", "case"), CASES, ids=[f"{f}:{c['name']}" for f, _, c in CASES])
def test_canonical_bytes_and_signature_agree_with_vector(
    file: str, doc: dict[str, Any], case: dict[str, Any]
) -> None:
    raw = _wire_bytes(case["envelope"])
    try:
        decoded = wire.decode(raw)
    except EnvelopeError:
        assert case["canonical_hex"] == ""
        return
    assert decoded.canonical.hex() == case["canonical_hex"]
    key = _keys(doc).get(decoded.fields.kid)
    if key is None:
        assert case["expect"]["error"] == "unknown_kid"
        return
    signature_ok = key.verify(decoded.signature, bytes.fromhex(case["canonical_hex"]))
    assert signature_ok == (case["expect"].get("error") != "bad_signature")


def test_absent_and_empty_fields_encode_identically() -> None:
    by_name = {case["name"]: case for _, _, case in CASES}
    assert by_name["valid_absent_fields"]["canonical_hex"] == by_name["valid_empty_fields"]["canonical_hex"]


def test_vectors_are_reproducible_from_the_generator() -> None:
    from tools import gen_envelope_vectors

    for name, doc in gen_envelope_vectors.documents().items():
        assert (VECTORS / name).read_text() == gen_envelope_vectors.render(doc), f"{name} is stale"
