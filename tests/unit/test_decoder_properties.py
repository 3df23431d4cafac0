"""Every decoder of untrusted bytes answers with a domain error, never another exception.

A decoder that lets a ``KeyError`` or ``RecursionError`` escape turns a bad
request into a 500 (or a dropped socket) instead of a clear 4xx with a stable
code. Hypothesis feeds each one arbitrary input and structured near-misses;
the envelope decoder has its own properties in test_envelope_properties.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from common import protocol
from common.errors import InvalidArgument, Unauthenticated, VersusError
from common.grpc.server import bearer_token
from common.trust import collector_jwt
from enrollment.ca import validate_csr
from gateway.collector_bodies import ClaimBody, ReportBody
from gateway.control_frames import parse_frame
from gateway.enroll_api import parse_body

# What a control frame the gateway cannot read is refused with.
FRAME_REFUSALS = {"malformed_frame", "version_unsupported"}

KEY = ec.generate_private_key(ec.SECP256R1())
NOW = int(time.time())
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@FAST
@given(st.text(max_size=300))
def test_any_text_as_a_bearer_token_is_refused_cleanly(token: str) -> None:
    with pytest.raises(Unauthenticated):
        collector_jwt.verify(token, KEY.public_key(), NOW)
    with contextlib.suppress(Unauthenticated):
        collector_jwt.unverified_subject(token)


@example(claims={}, header={"kid": None})  # PyJWT refuses to encode this header
@FAST
@given(
    st.dictionaries(st.text(max_size=8), json_values, max_size=8),
    st.dictionaries(st.text(max_size=8), json_values, max_size=6),
)
def test_correctly_signed_tokens_with_arbitrary_claims_never_escape(
    claims: dict[str, Any], header: dict[str, Any]
) -> None:
    # Signed with the collector's own key: only the collector could send these, but a bug must
    # still answer 401 with a code, never a 500.
    try:
        token = jwt.encode(claims, KEY, algorithm="ES256", headers=header)
    except (TypeError, ValueError, jwt.PyJWTError):
        return  # not encodable as a JWT at all (PyJWT refuses some headers, e.g. a non-string kid)
    with contextlib.suppress(Unauthenticated):
        collector_jwt.verify(token, KEY.public_key(), NOW)


@pytest.mark.parametrize(
    "drop", ["iss", "sub", "aud", "iat", "exp", "jti"], ids=lambda name: f"without-{name}"
)
def test_a_signed_token_missing_any_claim_is_malformed(drop: str) -> None:
    claims = {
        "iss": "c1",
        "sub": "c1",
        "aud": collector_jwt.AUDIENCE,
        "iat": NOW,
        "exp": NOW + 60,
        "jti": "j",
    }
    del claims[drop]
    token = jwt.encode(claims, KEY, algorithm="ES256")
    with pytest.raises(Unauthenticated) as refused:
        collector_jwt.verify(token, KEY.public_key(), NOW)
    assert refused.value.code in ("bearer_malformed", "bearer_wrong_audience")


@FAST
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=2))
def test_a_tampered_segment_of_a_valid_token_is_refused(noise: bytes, segment: int) -> None:
    parts = collector_jwt.mint(KEY, "c1", NOW, method="POST", path="/api/collector/v1/claim").split(".")
    parts[segment] = _b64url(base64.urlsafe_b64decode(parts[segment] + "==") + noise) if noise else ""
    token = ".".join(parts)
    with pytest.raises(Unauthenticated):
        collector_jwt.verify(token, KEY.public_key(), NOW)


@FAST
@given(st.text(max_size=400))
def test_any_text_as_a_control_frame_is_refused_or_parsed(text: str) -> None:
    try:
        frame_id, kind, _, body, version = parse_frame(text)
    except InvalidArgument as exc:
        assert exc.code in FRAME_REFUSALS
        return
    assert version in range(protocol.MIN_PROTOCOL_VERSION, protocol.PROTOCOL_VERSION + 1)
    assert 0 < len(frame_id) <= 64 and isinstance(kind, str)
    if version >= protocol.FRAME_BODY_AS_TEXT:
        # The body's text as sent, its UTF-8 bytes: the operation parses (and refuses) them itself.
        assert body == json.loads(text).get("body", "").encode()
    else:
        assert isinstance(json.loads(body), dict)


@FAST
@given(json_values)
def test_any_json_value_as_a_control_frame_is_refused_or_parsed(value: Any) -> None:
    try:
        parse_frame(json.dumps(value))
    except InvalidArgument as exc:
        assert exc.code in FRAME_REFUSALS


def test_a_frame_in_a_version_not_spoken_is_refused_as_such_not_as_malformed() -> None:
    for v in (0, protocol.PROTOCOL_VERSION + 1, "1", 1.0, None):
        with pytest.raises(protocol.VersionUnsupported):
            parse_frame(json.dumps({"v": v, "id": "1", "type": "claim", "body": {}}))


BOUND: dict[str, Any] = {
    "iss": "c1", "sub": "c1", "aud": collector_jwt.AUDIENCE, "jti": "jti-0001",
    "htm": "GET", "htu": "/api/collector/v1/enrollment", "bsh": collector_jwt.body_digest(b""),
}  # fmt: skip


@pytest.mark.parametrize("depth", [100, 10_000, 200_000])
def test_deeply_nested_json_is_a_clean_refusal(depth: int) -> None:
    nested = "[" * depth + "]" * depth
    with pytest.raises(InvalidArgument):
        parse_frame('{"v": 1, "id": "1", "type": "claim", "body": ' + nested + "}")
    for model in (ClaimBody, ReportBody):
        with pytest.raises(InvalidArgument):
            parse_body(model, ('{"claim_seq": ' + nested + "}").encode())


@FAST
@given(st.binary(max_size=400) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_claim_or_report_body_is_refused_or_parsed(raw: bytes) -> None:
    for model in (ClaimBody, ReportBody):
        try:
            parse_body(model, raw)
        except InvalidArgument as exc:
            assert exc.code == "invalid_body"


@FAST
@given(st.text(max_size=600))
def test_any_text_as_a_csr_is_refused_cleanly(text: str) -> None:
    with pytest.raises(InvalidArgument):
        validate_csr(text)


@FAST
@given(st.binary(min_size=1, max_size=300))
def test_any_der_inside_a_pem_frame_is_refused_cleanly(der: bytes) -> None:
    pem = (
        "-----BEGIN CERTIFICATE REQUEST-----\n"
        + base64.b64encode(der).decode()
        + "\n-----END CERTIFICATE REQUEST-----\n"
    )
    with pytest.raises(VersusError):
        validate_csr(pem)


@FAST
@given(st.none() | st.text(max_size=60))
def test_any_authorization_header_yields_a_token_or_none(value: str | None) -> None:
    token = bearer_token(value)
    assert token is None or (token and token == token.strip())


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"iat": NOW + 600, "exp": NOW + 660}, "bearer_not_yet_valid"),
        ({"nbf": NOW + 600}, "bearer_not_yet_valid"),  # one code for both ways of saying "later"
        ({"nbf": float(NOW)}, "bearer_malformed"),
        ({"iat": float(NOW)}, "bearer_malformed"),
        ({"exp": True}, "bearer_malformed"),
        ({"iat": NOW - 700, "exp": NOW - 600}, "bearer_expired"),
    ],
)
def test_bearer_time_rules(change: dict[str, Any], code: str) -> None:
    claims: dict[str, Any] = {**BOUND, "iat": NOW, "exp": NOW + 60}
    claims.update(change)
    token = jwt.encode(claims, KEY, algorithm="ES256")
    with pytest.raises(collector_jwt.BearerError) as info:
        collector_jwt.verify(token, KEY.public_key(), NOW)
    assert info.value.code == code


def test_a_past_nbf_is_fine() -> None:
    claims = {**BOUND, "iat": NOW, "exp": NOW + 60, "nbf": NOW - 5}
    assert (
        collector_jwt.verify(jwt.encode(claims, KEY, algorithm="ES256"), KEY.public_key(), NOW).collector_id
        == "c1"
    )
