"""Vault mode A at rest: the collector's device credentials sealed under its own identity key.

``credentials.sealed`` (mode 0600) is a small JSON document::

    {"format": "versus-sealed-credentials", "v": 1, "nonce": "<b64url>", "ciphertext": "<b64url>"}

The plaintext (the JSON object drivers read: ``{"ssh": {target: {...}}, ...}``) is
encrypted with AES-256-GCM. Its key is derived with HKDF-SHA256 from the
collector's enrollment identity — the private scalar of ``key.pem`` — so the
sealed file alone, copied off the machine, is useless without that key. The
format and version are authenticated as associated data, and any change to the
file (a flipped bit, another collector's file) fails authentication:
``credentials_tampered``, never a silently wrong credential.

Pure code: no file I/O (collector/credentials.py reads and writes the file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.trust import b64url

FORMAT = "versus-sealed-credentials"
VERSION = 1
_AAD = f"{FORMAT} v{VERSION}".encode()
_SALT = b"versus collector credentials"
_NONCE_BYTES = 12


class SealedError(ValueError):
    """The sealed file cannot be opened; ``code`` says why (stable, safe to log)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def sealing_key(identity: ec.EllipticCurvePrivateKey) -> bytes:
    """The AES-256 key for ``identity``'s credentials (HKDF-SHA256 of its private scalar)."""
    scalar = identity.private_numbers().private_value.to_bytes(32, "big")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=_AAD).derive(scalar)


def _aad(purpose: str) -> bytes:
    # The device credentials file has no purpose (its format predates it); anything else sealed
    # with the same key names its own, so one sealed file cannot stand in for another.
    return _AAD + (b"\n" + purpose.encode() if purpose else b"")


def seal(identity: ec.EllipticCurvePrivateKey, credentials: Mapping[str, Any], purpose: str = "") -> bytes:
    """The sealed file's content for ``credentials`` (``purpose``: what else than the device
    credentials it holds, e.g. the vault mode C secret id)."""
    nonce = os.urandom(_NONCE_BYTES)
    plaintext = json.dumps(dict(credentials), separators=(",", ":"), sort_keys=True).encode()
    ciphertext = AESGCM(sealing_key(identity)).encrypt(nonce, plaintext, _aad(purpose))
    doc = {
        "format": FORMAT,
        "v": VERSION,
        "nonce": b64url.encode(nonce),
        "ciphertext": b64url.encode(ciphertext),
    }
    return (json.dumps(doc) + "\n").encode()


def unseal(identity: ec.EllipticCurvePrivateKey, raw: bytes, purpose: str = "") -> dict[str, Any]:
    """The credentials in a sealed file (sealed for ``purpose``), or :class:`SealedError`."""
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise SealedError("credentials_not_sealed", "this is not a sealed credentials file")
        if doc.get("v") != VERSION:
            raise SealedError(
                "credentials_version", f"sealed credentials version {doc.get('v')!r} is not known"
            )
        nonce, ciphertext = b64url.decode(str(doc["nonce"])), b64url.decode(str(doc["ciphertext"]))
    except SealedError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SealedError("credentials_tampered", "the sealed credentials file is damaged") from None
    try:
        plaintext = AESGCM(sealing_key(identity)).decrypt(nonce, ciphertext, _aad(purpose))
    except (InvalidTag, ValueError):
        raise SealedError(
            "credentials_tampered",
            "the sealed credentials do not open with this collector's key: altered, or sealed for "
            "another identity",
        ) from None
    value = json.loads(plaintext)
    if not isinstance(value, dict):
        raise SealedError("credentials_tampered", "the sealed credentials are not a JSON object")
    return value
