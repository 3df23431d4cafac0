"""Bearer tokens collectors present on every gateway call: short-lived ES256 JWTs.

The collector signs with the private key of its enrolled certificate; the
gateway verifies with the public key on record for the ``sub`` claim. Identity
comes only from a verified token. Claims:

    iss  collector id           sub  collector id (the same)
    aud  "versus-collector-gateway"
    iat  issued at (Unix s)     exp  expiry, at most MAX_LIFETIME_S after iat
    jti  unique token id        nbf  optional: not before (Unix s)

iat, exp and nbf are JSON integers (not floats, not booleans). A token whose
iat or nbf is later than now + LEEWAY_S is ``bearer_not_yet_valid``; one past
exp + LEEWAY_S is ``bearer_expired``. The verification key is found by ``sub``
(which must equal ``iss``); header fields such as ``kid`` and ``x5t`` are ignored.

Pure code; key lookup is the caller's job.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from common.errors import Unauthenticated

AUDIENCE = "versus-collector-gateway"
ALGORITHM = "ES256"
DEFAULT_LIFETIME_S = 60
MAX_LIFETIME_S = 300
LEEWAY_S = 30
MAX_TOKEN_CHARS = 4096


class BearerError(Unauthenticated):
    default_code = "bearer_invalid"


@dataclass(frozen=True, slots=True)
class BearerClaims:
    collector_id: str
    issued_at: int
    expires_at: int
    token_id: str


def mint(
    key: ec.EllipticCurvePrivateKey, collector_id: str, now: int, lifetime_s: int = DEFAULT_LIFETIME_S
) -> str:
    claims = {
        "iss": collector_id,
        "sub": collector_id,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + lifetime_s,
        "jti": secrets.token_urlsafe(12),
    }
    return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"typ": "JWT"})


def unverified_subject(token: str) -> str:
    """The ``sub`` claim before verification, only to find the key to verify with."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        raise BearerError("bearer token missing or too long", code="bearer_malformed")
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise BearerError("bearer token is not a JWT", code="bearer_malformed") from None
    if header.get("alg") != ALGORITHM:
        raise BearerError(f"bearer token must be signed with {ALGORITHM}", code="bearer_malformed")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise BearerError("bearer token has no subject", code="bearer_malformed")
    return sub


def verify(token: str, public_key: ec.EllipticCurvePublicKey, now: int) -> BearerClaims:
    """Check signature, audience, times and lifetime; raise :class:`BearerError` with a stable code."""
    try:
        claims: Mapping[str, Any] = jwt.decode(
            token,
            public_key,
            algorithms=[ALGORITHM],
            audience=AUDIENCE,
            leeway=LEEWAY_S,
            options={
                "require": ["iss", "sub", "aud", "iat", "exp", "jti"],
                # Times are checked below against the caller's clock, with one code per rule.
                "verify_iat": False,
                "verify_exp": False,
                "verify_nbf": False,
            },
        )
    except jwt.InvalidAudienceError:
        raise BearerError("bearer token is for another audience", code="bearer_wrong_audience") from None
    except jwt.InvalidSignatureError:
        raise BearerError("bearer token signature does not verify", code="bearer_bad_signature") from None
    except jwt.PyJWTError as exc:
        raise BearerError(f"bearer token rejected: {exc}", code="bearer_malformed") from None
    if claims["iss"] != claims["sub"]:
        raise BearerError("iss and sub must both be the collector id", code="bearer_malformed")
    iat, exp = claims["iat"], claims["exp"]
    if not (isinstance(iat, int) and isinstance(exp, int)) or isinstance(iat, bool) or isinstance(exp, bool):
        raise BearerError("iat and exp must be integers", code="bearer_malformed")
    if exp - iat > MAX_LIFETIME_S:
        raise BearerError(
            f"bearer tokens may live at most {MAX_LIFETIME_S}s", code="bearer_lifetime_too_long"
        )
    nbf = claims.get("nbf", iat)
    if not isinstance(nbf, int) or isinstance(nbf, bool):
        raise BearerError("nbf must be an integer", code="bearer_malformed")
    if max(iat, nbf) > now + LEEWAY_S:
        raise BearerError(
            "bearer token is not valid yet (iat or nbf in the future); check the clock",
            code="bearer_not_yet_valid",
        )
    if now > exp + LEEWAY_S:
        raise BearerError("bearer token has expired", code="bearer_expired")
    return BearerClaims(str(claims["sub"]), iat, exp, str(claims["jti"]))
