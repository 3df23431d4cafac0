"""The collector's signature on a report: what it says happened, signed with its own key.

The bearer token already binds a report's bytes for the trip to the gateway;
this signature travels on to the router, which checks it against the
collector's key in PostgreSQL before recording anything, and is stored with
the dispatch. So neither a proxy on the collector's path nor anything between
the gateway and the router can change an outcome, and anyone auditing a
dispatch later can check that the collector said exactly what is recorded.

A compact ES256 JWS with these claims (``typ`` ``versus-report+jwt``):

    iss  collector id        iat  when it was signed (Unix s)
    tid  the dispatch id the report is about (the envelope's task_id)
    out  outcome: running, success, failed, unknown, refused or cancelled
    rsh  SHA-256 of the result bytes, base64url without padding
    ecd  error code          emh  SHA-256 of the error message, base64url
    oln  length of the streamed output (decimal), and
    osh  its SHA-256 (hex): both only when the report names an output (protocol 4)

Pure code: the caller finds the key.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from common.errors import PermissionDenied
from common.trust import b64url

ALGORITHM = "ES256"
TYPE = "versus-report+jwt"
MAX_CHARS = 2048
# Claims present only when the report carries what they cover.
OPTIONAL_CLAIMS = ("oln", "osh")


class ReportSignatureError(PermissionDenied):
    default_code = "report_signature_invalid"


@dataclass(frozen=True, slots=True)
class ReportStatement:
    """What a report says; the signature covers exactly these fields."""

    collector_id: str
    dispatch_id: str
    outcome: str
    result: bytes = b""
    error_code: str = ""
    error_message: str = ""
    # The streamed output the report names (protocol 4); None: none.
    output_length: int | None = None
    output_sha256: str = ""

    def claims(self) -> dict[str, str]:
        claims = {
            "iss": self.collector_id,
            "tid": self.dispatch_id,
            "out": self.outcome,
            "rsh": b64url.sha256(self.result),
            "ecd": self.error_code,
            "emh": b64url.sha256(self.error_message.encode()),
        }
        if self.output_length is not None:
            claims["oln"] = str(self.output_length)
            claims["osh"] = self.output_sha256.lower()
        return claims


def sign(key: ec.EllipticCurvePrivateKey, statement: ReportStatement, now: int) -> str:
    return jwt.encode({**statement.claims(), "iat": now}, key, algorithm=ALGORITHM, headers={"typ": TYPE})


def verify(signature: str, public_key: ec.EllipticCurvePublicKey, statement: ReportStatement) -> None:
    """Raise :class:`ReportSignatureError` unless ``signature`` is the collector's over ``statement``."""
    if not signature:
        raise ReportSignatureError("the report carries no signature", code="report_unsigned")
    if len(signature) > MAX_CHARS:
        raise ReportSignatureError("the report signature is too long")
    try:
        if jwt.get_unverified_header(signature).get("typ") != TYPE:
            raise ReportSignatureError("the report signature is not a report signature")
        claims: Mapping[str, Any] = jwt.decode(
            signature, public_key, algorithms=[ALGORITHM], options={"verify_iat": False, "require": ["iat"]}
        )
    except jwt.PyJWTError:
        raise ReportSignatureError("the report signature does not verify with the collector's key") from None
    expected = statement.claims()
    if any(name in claims and name not in expected for name in OPTIONAL_CLAIMS):
        # Signed with an output the report no longer names: something on the way removed it.
        raise ReportSignatureError("the report differs from what the collector signed (output)")
    for name, value in expected.items():
        got = claims.get(name)
        if not isinstance(got, str) or not secrets.compare_digest(got.encode(), value.encode()):
            raise ReportSignatureError(f"the report differs from what the collector signed ({name})")
