"""Enrollment tokens: generation, hashing and the limits an operator may ask for.

A token's plaintext is ``vst_`` followed by 43 base64url characters (256 random
bits). The prefix lets secret scanners recognise a leaked token; the
control plane stores only its SHA-256 and shows the plaintext once, at issue.
Pure code: no I/O.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from enum import StrEnum

from common.errors import InvalidArgument
from common.telemetry.redaction import Secret

PREFIX = "vst_"
# How much of the plaintext is kept for display ("vst_AbCd…"): enough to recognise, far too little to use.
DISPLAY_CHARS = len(PREFIX) + 6

DEFAULT_TTL = dt.timedelta(hours=1)
MAX_TTL = dt.timedelta(hours=24)
DEFAULT_MAX_USES = 1
MAX_USES_LIMIT = 1000
# Longest plaintext we bother hashing; anything longer cannot be a token.
MAX_PLAINTEXT_CHARS = 128


class ApprovalMode(StrEnum):
    AUTO = "auto"
    MANUAL = "manual"


class TokenStatus(StrEnum):
    ACTIVE = "active"
    EXHAUSTED = "exhausted"
    EXPIRED = "expired"
    REVOKED = "revoked"


@dataclass(frozen=True, slots=True)
class NewToken:
    """A freshly minted token. ``plaintext`` is wrapped so it cannot leak through ``repr``."""

    token_id: str
    plaintext: Secret[str]
    sha256: bytes
    display_prefix: str


def token_hash(plaintext: str) -> bytes:
    return hashlib.sha256(plaintext.encode("utf-8", "surrogatepass")).digest()


def mint() -> NewToken:
    plaintext = PREFIX + secrets.token_urlsafe(32)
    return NewToken(
        token_id=f"tok-{secrets.token_hex(8)}",
        plaintext=Secret(plaintext),
        sha256=token_hash(plaintext),
        display_prefix=plaintext[:DISPLAY_CHARS],
    )


def looks_like_token(candidate: str) -> bool:
    """Cheap shape check before touching the database; failing it is still 'invalid token'."""
    return candidate.startswith(PREFIX) and len(candidate) <= MAX_PLAINTEXT_CHARS


def issue_limits(max_uses: int | None, ttl_seconds: int | None) -> tuple[int, dt.timedelta]:
    """Apply the defaults for values not given; refuse (never clamp or default) anything out of range."""
    uses = DEFAULT_MAX_USES if max_uses is None else max_uses
    if not 1 <= uses <= MAX_USES_LIMIT:
        raise InvalidArgument(
            f"max_uses must be between 1 and {MAX_USES_LIMIT}, not {uses}", code="max_uses_out_of_range"
        )
    if ttl_seconds is not None and ttl_seconds < 1:
        raise InvalidArgument(f"ttl must be at least 1 second, not {ttl_seconds}", code="ttl_out_of_range")
    ttl = DEFAULT_TTL if ttl_seconds is None else dt.timedelta(seconds=ttl_seconds)
    if ttl > MAX_TTL:
        raise InvalidArgument(
            f"ttl must be at most {int(MAX_TTL.total_seconds())} seconds ({MAX_TTL})", code="ttl_too_long"
        )
    return uses, ttl


def status_of(
    *, uses: int, max_uses: int, expires_at: dt.datetime, revoked_at: dt.datetime | None, now: dt.datetime
) -> TokenStatus:
    if revoked_at is not None:
        return TokenStatus.REVOKED
    if now >= expires_at:
        return TokenStatus.EXPIRED
    if uses >= max_uses:
        return TokenStatus.EXHAUSTED
    return TokenStatus.ACTIVE
