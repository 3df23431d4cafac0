"""Request binding of bearer tokens and the collector's report signature, fed values directly."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from common.trust import collector_jwt, report_signature
from common.trust.collector_jwt import BearerError
from common.trust.report_signature import ReportSignatureError, ReportStatement

KEY = ec.generate_private_key(ec.SECP256R1())
OTHER = ec.generate_private_key(ec.SECP256R1())
NOW = 1_800_000_000
PATH = "/api/collector/v1/report"


def _claims(method: str = "POST", path: str = PATH, body: bytes = b'{"a":1}') -> collector_jwt.BearerClaims:
    token = collector_jwt.mint(KEY, "c1", NOW, method=method, path=path, body=body)
    return collector_jwt.verify(token, KEY.public_key(), NOW)


def test_a_bound_token_accepts_exactly_its_request() -> None:
    claims = _claims()
    claims.check_request("POST", PATH)
    claims.check_body(b'{"a":1}')


@pytest.mark.parametrize(
    ("method", "path", "body", "code"),
    [
        ("GET", PATH, b'{"a":1}', "bearer_wrong_method"),
        ("POST", "/api/collector/v1/claim", b'{"a":1}', "bearer_wrong_path"),
        ("POST", PATH + "?x=1", b'{"a":1}', "bearer_wrong_path"),
        ("POST", PATH, b'{"a":2}', "bearer_wrong_body"),
        ("POST", PATH, b'{"a":1} ', "bearer_wrong_body"),
        ("POST", PATH, b"", "bearer_wrong_body"),
    ],
)
def test_any_other_request_is_refused_with_its_code(method: str, path: str, body: bytes, code: str) -> None:
    claims = _claims()

    def check() -> None:
        claims.check_request(method, path)
        claims.check_body(body)

    with pytest.raises(BearerError) as refused:
        check()
    assert refused.value.code == code


def test_a_frame_body_hashes_the_same_whatever_the_key_order_or_spacing() -> None:
    assert collector_jwt.frame_body({"b": 1, "a": [1, 2]}) == collector_jwt.frame_body({"a": [1, 2], "b": 1})
    assert collector_jwt.frame_body({"a": "é"}) == b'{"a":"\\u00e9"}'


def _statement(**change: object) -> ReportStatement:
    base = ReportStatement("c1", "dsp-1", "success", b"result", "", "")
    return dataclasses.replace(base, **change)  # type: ignore[arg-type]


def test_a_report_signature_verifies_for_what_was_signed() -> None:
    signature = report_signature.sign(KEY, _statement(), NOW)
    report_signature.verify(signature, KEY.public_key(), _statement())


@pytest.mark.parametrize(
    "change",
    [
        {"collector_id": "c2"},
        {"dispatch_id": "dsp-2"},
        {"outcome": "failed"},
        {"result": b"other"},
        {"error_code": "x"},
        {"error_message": "m"},
    ],
)
def test_a_report_that_differs_from_the_signed_one_is_refused(change: dict[str, object]) -> None:
    signature = report_signature.sign(KEY, _statement(), NOW)
    with pytest.raises(ReportSignatureError) as refused:
        report_signature.verify(signature, KEY.public_key(), _statement(**change))
    assert refused.value.code == "report_signature_invalid"


def test_unsigned_foreign_and_misused_signatures_are_refused() -> None:
    with pytest.raises(ReportSignatureError) as unsigned:
        report_signature.verify("", KEY.public_key(), _statement())
    assert unsigned.value.code == "report_unsigned"
    foreign = report_signature.sign(OTHER, _statement(), NOW)
    bearer = collector_jwt.mint(KEY, "c1", NOW, method="POST", path=PATH)
    for signature in (foreign, bearer, "a.b.c", "x" * 3000):
        with pytest.raises(ReportSignatureError) as refused:
            report_signature.verify(signature, KEY.public_key(), _statement())
        assert refused.value.code == "report_signature_invalid"
