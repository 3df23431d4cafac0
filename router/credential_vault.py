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
:meth:`MasterKeys.load_or_create`.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from common.errors import ConfigError, FailedPrecondition
from common.state_dir import write_private

DEFAULT_FILE = "credentials-master-keys.json"
_WRAP_AAD = b"versus credential data key v1"
_NONCE = 12


class CredentialUnreadable(FailedPrecondition):
    """A stored credential does not open: its master key is missing, or the row was altered."""

    default_code = "credential_unreadable"


@dataclass(frozen=True, slots=True)
class MasterKeys:
    """The operator's master keys: one active (wraps), all listed (unwrap)."""

    active: str
    keys: Mapping[str, bytes] = field(repr=False)

    def __repr__(self) -> str:  # secret
        return f"MasterKeys(active={self.active!r}, kids={sorted(self.keys)!r})"

    @classmethod
    def parse(cls, raw: bytes, where: str) -> MasterKeys:
        try:
            doc = json.loads(raw)
            keys = {
                str(kid): base64.b64decode(str(value), validate=True) for kid, value in doc["keys"].items()
            }
            active = str(doc["active"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{where}: not a master key file ({type(exc).__name__})") from None
        if active not in keys or any(len(k) != 32 for k in keys.values()):
            raise ConfigError(f"{where}: the active key must be listed, and every key must be 32 bytes")
        return cls(active, keys)

    @classmethod
    def load_or_create(cls, path: Path, create: bool) -> MasterKeys:
        """The keys in ``path``; with ``create``, a new file with one key when there is none."""
        if not path.exists():
            if not create:
                raise ConfigError(f"{path}: the credentials master key file does not exist")
            kid = f"mk-{secrets.token_hex(4)}"
            doc = {"active": kid, "keys": {kid: base64.b64encode(os.urandom(32)).decode()}}
            write_private(path, json.dumps(doc, indent=2).encode())
        if path.stat().st_mode & 0o077:
            raise ConfigError(f"{path} is readable by others; run `chmod 600 {path}`")
        return cls.parse(path.read_bytes(), str(path))

    def wrap(self, data_key: bytes) -> tuple[str, bytes]:
        nonce = os.urandom(_NONCE)
        return self.active, nonce + AESGCM(self.keys[self.active]).encrypt(nonce, data_key, _WRAP_AAD)

    def unwrap(self, kid: str, wrapped: bytes) -> bytes:
        key = self.keys.get(kid)
        if key is None:
            raise CredentialUnreadable(
                f"the credential's data key is wrapped with master key {kid!r}, which is not loaded"
            )
        try:
            return AESGCM(key).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _WRAP_AAD)
        except (InvalidTag, ValueError):
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
    kid, wrapped = master.wrap(data_key)
    return SealedCredential(kid, wrapped, nonce, ciphertext)


def open_value(
    master: MasterKeys, tenant_id: str, ref: str, version: int, sealed: SealedCredential
) -> dict[str, Any]:
    data_key = master.unwrap(sealed.key_id, sealed.wrapped_key)
    try:
        plaintext = AESGCM(data_key).decrypt(sealed.nonce, sealed.ciphertext, _aad(tenant_id, ref, version))
    except (InvalidTag, ValueError):
        raise CredentialUnreadable("the stored credential does not open: altered or moved") from None
    value: dict[str, Any] = json.loads(plaintext)
    return value


def rewrap(master: MasterKeys, sealed: SealedCredential) -> SealedCredential:
    """The same credential with its data key wrapped by the active master key."""
    kid, wrapped = master.wrap(master.unwrap(sealed.key_id, sealed.wrapped_key))
    return SealedCredential(kid, wrapped, sealed.nonce, sealed.ciphertext)
