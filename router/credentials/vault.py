"""Vault mode B at rest: device credentials in PostgreSQL under envelope encryption.

Each stored credential (a JSON object, as a driver reads it) is encrypted with
its own random 256-bit data key (AES-256-GCM); the data key is wrapped with the
operator's **master key** (AES-256-GCM again) and stored beside it with the
master key's id. PostgreSQL never holds a credential or a data key in the clear.
The associated data binds each ciphertext to its tenant, reference and version,
so a row copied onto another (or rolled back) does not open.

Master keys come from a file the operator provides
(``VERSUS_CREDENTIALS_MASTER_KEYS_FILE``), or on a single host from
``<state>/credentials-master-keys.json``, created on first use (mode 0600)::

    {"active": "mk-2", "keys": {"mk-1": "<base64 of 32 bytes>", "mk-2": "<...>"}}

Rotation: add a key and make it ``active`` (new writes wrap with it, every key
listed still unwraps), run ``versus-cp credentials rewrap`` (every data key is
wrapped again with the active one), then remove the old key. Pure code but for
:meth:`MasterKeys.load_or_create` (common/trust/master_keys.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from common.errors import FailedPrecondition
from common.trust.master_keys import CREDENTIALS_MASTER_FILE, MasterKeys, SealBroken, UnknownMasterKey

DEFAULT_FILE = CREDENTIALS_MASTER_FILE
_WRAP_AAD = b"versus credential data key v1"
_NONCE = 12

__all__ = ["CredentialUnreadable", "MasterKeys", "SealedCredential", "open_value", "rewrap", "seal_value"]


class CredentialUnreadable(FailedPrecondition):
    """A stored credential does not open: its master key is missing, or the row was altered."""

    default_code = "credential_unreadable"


def wrap(master: MasterKeys, data_key: bytes) -> tuple[str, bytes]:
    """``data_key`` wrapped with the active master key: (key id, wrapped bytes)."""
    return master.seal(data_key, _WRAP_AAD)


def unwrap(master: MasterKeys, kid: str, wrapped: bytes) -> bytes:
    try:
        return master.open(kid, wrapped, _WRAP_AAD)
    except UnknownMasterKey:
        raise CredentialUnreadable(
            f"the credential's data key is wrapped with master key {kid!r}, which is not loaded"
        ) from None
    except SealBroken:
        raise CredentialUnreadable("the credential's data key does not open: altered") from None


@dataclass(frozen=True, slots=True)
class SealedCredential:
    """One credential as PostgreSQL stores it."""

    key_id: str
    wrapped_key: bytes
    nonce: bytes
    ciphertext: bytes


def _aad(tenant_id: str, ref: str, version: int) -> bytes:
    return json.dumps(["versus credential v1", tenant_id, ref, version]).encode()


def seal_value(
    master: MasterKeys, tenant_id: str, ref: str, version: int, value: Mapping[str, Any]
) -> SealedCredential:
    data_key = AESGCM.generate_key(bit_length=256)
    nonce = os.urandom(_NONCE)
    plaintext = json.dumps(dict(value), separators=(",", ":"), sort_keys=True).encode()
    ciphertext = AESGCM(data_key).encrypt(nonce, plaintext, _aad(tenant_id, ref, version))
    kid, wrapped = wrap(master, data_key)
    return SealedCredential(kid, wrapped, nonce, ciphertext)


def open_value(
    master: MasterKeys, tenant_id: str, ref: str, version: int, sealed: SealedCredential
) -> dict[str, Any]:
    data_key = unwrap(master, sealed.key_id, sealed.wrapped_key)
    try:
        plaintext = AESGCM(data_key).decrypt(sealed.nonce, sealed.ciphertext, _aad(tenant_id, ref, version))
    except (InvalidTag, ValueError):
        raise CredentialUnreadable("the stored credential does not open: altered or moved") from None
    value: dict[str, Any] = json.loads(plaintext)
    return value


def rewrap(master: MasterKeys, sealed: SealedCredential) -> SealedCredential:
    """The same credential with its data key wrapped by the active master key."""
    kid, wrapped = wrap(master, unwrap(master, sealed.key_id, sealed.wrapped_key))
    return SealedCredential(kid, wrapped, sealed.nonce, sealed.ciphertext)
