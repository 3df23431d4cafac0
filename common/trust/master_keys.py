"""Operator master keys: a file of named 256-bit AES keys, one of them active.

Two things are sealed with such keys: vault mode B's device credentials
(router/credentials/vault.py wraps each credential's data key) and the shared key
and CA material of a scaled-out control plane (common/material/shared.py). The file
format is the same for both, so an operator learns one procedure::

    {"active": "mk-2", "keys": {"mk-1": "<base64 of 32 bytes>", "mk-2": "<...>"}}

The active key seals; every key listed opens. Rotation: add a key, make it
active, re-seal, then remove the old one. Pure code but for
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

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from common.config.state_dir import write_private
from common.errors import ConfigError

NONCE_BYTES = 12
# Vault mode B's master key file under the state directory when the operator supplies none.
CREDENTIALS_MASTER_FILE = "credentials-master-keys.json"


class UnknownMasterKey(Exception):
    """Sealed with a key this file does not list."""


class SealBroken(Exception):
    """The sealed bytes do not open under their key: altered, moved, or another key of that name."""


@dataclass(frozen=True, slots=True)
class MasterKeys:
    """The operator's master keys: one active (seals), all listed (open). ``repr`` shows ids only."""

    active: str
    keys: Mapping[str, bytes] = field(repr=False)

    def __repr__(self) -> str:  # secret
        return f"MasterKeys(active={self.active!r}, kids={sorted(self.keys)!r})"

    @classmethod
    def generate(cls) -> MasterKeys:
        kid = f"mk-{secrets.token_hex(4)}"
        return cls(kid, {kid: os.urandom(32)})

    def to_json(self) -> bytes:
        doc = {"active": self.active, "keys": {k: base64.b64encode(v).decode() for k, v in self.keys.items()}}
        return json.dumps(doc, indent=2).encode()

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
    def load(cls, path: Path) -> MasterKeys:
        """The keys in ``path``, which must exist and be readable by its owner only."""
        try:
            mode = path.stat().st_mode
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the master key file: {exc.strerror}") from None
        if mode & 0o077:
            raise ConfigError(f"{path} is readable by others; run `chmod 600 {path}`")
        return cls.parse(raw, str(path))

    @classmethod
    def load_or_create(cls, path: Path, create: bool) -> MasterKeys:
        """The keys in ``path``; with ``create``, a new file with one key when there is none."""
        if not path.exists():
            if not create:
                raise ConfigError(f"{path}: the master key file does not exist")
            write_private(path, cls.generate().to_json())
        return cls.load(path)

    def seal(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes]:
        """``plaintext`` encrypted under the active key, bound to ``aad``: (key id, nonce + ciphertext)."""
        nonce = os.urandom(NONCE_BYTES)
        return self.active, nonce + AESGCM(self.keys[self.active]).encrypt(nonce, plaintext, aad)

    def open(self, kid: str, sealed: bytes, aad: bytes) -> bytes:
        """The plaintext of :meth:`seal`'s output; raises :class:`UnknownMasterKey` or :class:`SealBroken`."""
        key = self.keys.get(kid)
        if key is None:
            raise UnknownMasterKey(kid)
        try:
            return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
        except (InvalidTag, ValueError):
            raise SealBroken(kid) from None
