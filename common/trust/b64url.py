"""base64url without padding (RFC 7515 §2), the encoding of every signed document and digest claim."""

from __future__ import annotations

import base64
import hashlib


def encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode(text: str) -> bytes:
    """Raises ``binascii.Error`` (a ``ValueError``) on text that is not base64url."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sha256(data: bytes) -> str:
    """SHA-256 of ``data``, base64url without padding (43 characters)."""
    return encode(hashlib.sha256(data).digest())
