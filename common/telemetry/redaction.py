"""Scrub secrets from anything on its way to a log line.

Two defences, both applied by the log pipeline to every event:

* by **key** - a field whose name says it holds a secret (``token``,
  ``password``, ``private_key``, ``authorization``, ...) is replaced whole;
* by **shape** - inside any string, PEM private-key blocks, JWTs, bearer
  credentials, enrollment tokens and URL passwords are replaced, so a secret
  interpolated into a message or an exception text is caught too.

:class:`Secret` wraps a value so ``repr``/``str`` never show it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

REDACTED = "[REDACTED]"

# Field names (compared lower-case, with '-' as '_') whose values are always secret.
_SECRET_KEY = re.compile(
    r"(^|_)(token|secret|password|passwd|private_key|privkey|credential|credentials|authorization|"
    r"api_key|apikey|csr_pem|key_pem|plaintext|cookie)($|_)"
)
# Names that contain a secret word but are safe identifiers or digests.
_SAFE_KEY = re.compile(r"(_id|_ids|_sha256|_hash|_prefix|_count|_kid|_expires_at|_status|_uses)$")

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys of any flavour (PKCS#8, RSA, EC, encrypted).
    (
        re.compile(
            r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(-----END \1PRIVATE KEY-----|$)",
            re.DOTALL,
        ),
        "[REDACTED PRIVATE KEY]",
    ),
    # Authorization header values.
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    # Compact JWS/JWT: three base64url segments, the first starting with '{"' encoded.
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), REDACTED),
    # Enrollment tokens carry a recognisable prefix (see docs/enrollment.md).
    (re.compile(r"\bvst_[A-Za-z0-9_-]{8,}"), "vst_" + REDACTED),
    # user:password@ in URLs.
    (
        re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s/]+)@"),
        r"\g<scheme>\g<user>:***@",
    ),
    # password=... in query strings and libpq keyword strings.
    (re.compile(r"(?i)\b(password|passwd|pwd)=([^&\s]+)"), r"\1=***"),
)

T = TypeVar("T")


def is_secret_key(name: str) -> bool:
    """True when a field of this name must never be logged."""
    key = name.lower().replace("-", "_")
    return bool(_SECRET_KEY.search(key)) and not _SAFE_KEY.search(key)


def redact_text(text: str) -> str:
    """Replace every secret-shaped substring of ``text``."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any, *, _depth: int = 0) -> Any:
    """Redact a value of any shape: strings by pattern, mappings by key and value, sequences item by item."""
    if _depth > 8:
        return value
    if isinstance(value, Secret):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if isinstance(k, str) and is_secret_key(k) else redact(v, _depth=_depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return (
            type(value)(redact(v, _depth=_depth + 1) for v in value) if not isinstance(value, set) else value
        )
    if isinstance(value, BaseException):
        return redact_text(f"{type(value).__name__}: {value}")
    return value


def redact_url(url: str) -> str:
    """A URL safe to print: the password (if any) replaced."""
    return redact_text(url)


class Secret(Generic[T]):
    """Holds a secret value; ``repr`` and ``str`` show only that it is there."""

    __slots__ = ("_value",)

    def __init__(self, value: T):
        self._value = value

    def reveal(self) -> T:
        """The wrapped value. Call only where the secret is actually used."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)
