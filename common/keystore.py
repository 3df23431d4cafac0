"""Key sets persisted under the state directory.

Layout, per purpose (``dispatch`` or ``release``)::

    <state>/keys/<purpose>/keyset.json   kids, public keys, not_after, which kid is current
    <state>/keys/<purpose>/<kid>.pem     PKCS#8 private key, mode 0600

A rotation writes the new private key first and then replaces ``keyset.json``
atomically, under an exclusive lock, so a crash at any point leaves a usable
set. Processes that sign (the router) call :meth:`KeyStore.load` again when the
file's mtime changes, so a rotation takes effect without a restart.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from common.errors import ConfigError
from common.keys import DEFAULT_LIFETIME, KeyPurpose, KeySet, PublicKey, SigningKey
from common.state_dir import write_private, write_public

FORMAT = "versus-keyset/1"


class KeyStore:
    """Load, create and rotate the key set of one purpose in ``<state>/keys/<purpose>``."""

    def __init__(self, state_dir: Path, purpose: KeyPurpose):
        self.purpose = purpose
        self.directory = state_dir / "keys" / purpose.value
        self.index = self.directory / "keyset.json"

    def exists(self) -> bool:
        return self.index.exists()

    def load(self) -> KeySet:
        try:
            meta = json.loads(self.index.read_text())
            if meta.get("format") != FORMAT or meta.get("purpose") != self.purpose.value:
                raise ValueError("not a versus key set of this purpose")
            keys = []
            for entry in meta["keys"]:
                public = PublicKey.from_json(entry)
                private = serialization.load_pem_private_key(
                    (self.directory / f"{public.kid}.pem").read_bytes(), password=None
                )
                if not isinstance(private, Ed25519PrivateKey):
                    raise ValueError(f"{public.kid}.pem is not an Ed25519 key")
                key = SigningKey(public.kid, private, public.not_after)
                if key.public.public != public.public:
                    raise ValueError(f"{public.kid}.pem does not match its public key")
                keys.append(key)
            return KeySet(self.purpose, tuple(keys), str(meta["current"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot load {self.purpose.value} keys from {self.directory}: {exc}") from None

    def load_or_create(self, now: int | None = None, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> KeySet:
        with self._locked():
            if self.exists():
                return self.load()
            keyset = KeySet.create(self.purpose, _now(now), lifetime)
            self._save(keyset)
            return keyset

    def rotate(self, now: int | None = None, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> KeySet:
        """Add a key and make it current; older keys keep verifying until their not_after."""
        with self._locked():
            current = self.load() if self.exists() else KeySet.create(self.purpose, _now(now), lifetime)
            rotated = current.rotate(_now(now), lifetime)
            self._save(rotated)
            return rotated

    def mtime_ns(self) -> int:
        try:
            return self.index.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def _save(self, keyset: KeySet) -> None:
        for key in keyset.keys:
            path = self.directory / f"{key.kid}.pem"
            if not path.exists():
                pem = key.private_key().private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
                write_private(path, pem)
        meta = {
            "format": FORMAT,
            "purpose": self.purpose.value,
            "current": keyset.current_kid,
            "keys": [k.public.to_json() for k in keyset.keys],
        }
        write_public(self.index, (json.dumps(meta, indent=2) + "\n").encode())
        # Private keys of keys dropped from the set are no longer needed.
        kept = {f"{k.kid}.pem" for k in keyset.keys}
        for stale in self.directory.glob("*.pem"):
            if stale.name not in kept:
                stale.unlink()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.directory / ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


class ReloadingKeySet:
    """The current key set of a store, re-read when the store's index changes on disk.

    The mtime is checked at most every ``check_interval_s`` so signing stays cheap.
    """

    def __init__(self, store: KeyStore, check_interval_s: float = 2.0):
        self.store = store
        self.check_interval_s = check_interval_s
        self._keyset = store.load_or_create()
        self._mtime = store.mtime_ns()
        self._checked = time.monotonic()

    def get(self) -> KeySet:
        now = time.monotonic()
        if now - self._checked >= self.check_interval_s:
            self._checked = now
            mtime = self.store.mtime_ns()
            if mtime != self._mtime:
                self._keyset, self._mtime = self.store.load(), mtime
        return self._keyset


def _now(now: int | None) -> int:
    return int(time.time()) if now is None else now
