"""Bearer tokens collectors present on every gateway call: short-lived ES256 JWTs bound to one request.

The collector signs with the private key of its enrolled certificate; the
gateway verifies with the public key on record for the ``sub`` claim. Identity
comes only from a verified token. Claims:

    iss  collector id           sub  collector id (the same)
    aud  "versus-collector-gateway"
    iat  issued at (Unix s)     exp  expiry, at most MAX_LIFETIME_S after iat
    jti  unique token id        nbf  optional: not before (Unix s)
    htm  the request's method: GET or POST, or FRAME for a control-socket frame
    htu  the request's path and query (``/api/collector/v1/claim``); a frame names
         the HTTPS path of the same operation
    bsh  SHA-256 of the request body, base64url without padding (of b"" for none);
         a frame hashes :func:`frame_body` of its body object

iat, exp and nbf are JSON integers (not floats, not booleans). A token whose
iat or nbf is later than now + LEEWAY_S is ``bearer_not_yet_valid``; one past
exp + LEEWAY_S is ``bearer_expired``. The verification key is found by ``sub``
(which must equal ``iss``); header fields such as ``kid`` and ``x5t`` are ignored.

``htm``, ``htu`` and ``bsh`` bind the token to one request, as DPoP and SigV4
do: a proxy that reads the traffic cannot move a token to another endpoint or
put another body under it (``bearer_wrong_method|path|body``); with ``jti``
accepted once (the gateway's replay cache) it cannot replay it either. A token
without them is ``bearer_unbound``.

Pure code; key lookup and the replay cache are the caller's job.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from common.errors import Unauthenticated
from common.trust import b64url

AUDIENCE = "versus-collector-gateway"
ALGORITHM = "ES256"
DEFAULT_LIFETIME_S = 60
MAX_LIFETIME_S = 300
LEEWAY_S = 30
MAX_TOKEN_CHARS = 4096


class BearerError(Unauthenticated):
    default_code = "bearer_invalid"


FRAME = "FRAME"
_METHODS = frozenset({"GET", "POST", FRAME})


def body_digest(body: bytes) -> str:
    """The ``bsh`` claim for ``body``: SHA-256, base64url without padding."""
    return b64url.sha256(body)


def frame_body(body: Mapping[str, Any]) -> bytes:
    """The bytes a control-socket frame's body is hashed as: sorted keys, no spaces, ASCII.

    The gateway hashes the body object it parsed from the frame the same way, so
    the digest covers exactly what the gateway acts on.
    """
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class BearerClaims:
    collector_id: str
    issued_at: int
    expires_at: int
    token_id: str
    method: str = ""
    path: str = ""
    body_sha256: str = ""

    def check_request(self, method: str, path: str) -> None:
        """Refuse a token minted for another method or path."""
        if method != self.method:
            raise BearerError(
                f"the bearer token was signed for {self.method}, not {method}", code="bearer_wrong_method"
            )
        if path != self.path:
            raise BearerError("the bearer token was signed for another path", code="bearer_wrong_path")

    def check_body(self, body: bytes) -> None:
        """Refuse a body other than the one the token was signed over."""
        if not secrets.compare_digest(body_digest(body), self.body_sha256):
            raise BearerError(
                "the request body is not the one the token was signed over", code="bearer_wrong_body"
            )


def mint(
    key: ec.EllipticCurvePrivateKey,
    collector_id: str,
    now: int,
    *,
    method: str,
    path: str,
    body: bytes = b"",
    lifetime_s: int = DEFAULT_LIFETIME_S,
) -> str:
    """A token for one request: ``method`` and ``path`` (with any query) and the exact ``body`` bytes."""
    claims = {
        "iss": collector_id,
        "sub": collector_id,
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + lifetime_s,
        "jti": secrets.token_urlsafe(12),
        "htm": method,
        "htu": path,
        "bsh": body_digest(body),
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
    htm, htu, bsh = claims.get("htm"), claims.get("htu"), claims.get("bsh")
    if not (isinstance(htm, str) and isinstance(htu, str) and isinstance(bsh, str)):
        raise BearerError(
            "bearer tokens must bind the request (htm, htu and bsh claims)", code="bearer_unbound"
        )
    if htm not in _METHODS or not htu.startswith("/") or len(bsh) != 43:
        raise BearerError("the token's request binding is malformed", code="bearer_malformed")
    jti = claims["jti"]
    if not isinstance(jti, str) or not 8 <= len(jti) <= 64:
        raise BearerError("jti must be a string of 8 to 64 characters", code="bearer_malformed")
    return BearerClaims(str(claims["sub"]), iat, exp, jti, htm, htu, bsh)
