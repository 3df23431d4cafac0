"""Key sets persisted under the state directory.

Layout, per purpose (``dispatch`` or ``release``)::

    <state>/keys/<purpose>/keyset.json        kids, public keys, not_after, which kid is current,
                                              the set's version, and a key waiting to become current
    <state>/keys/<purpose>/<kid>.pem          PKCS#8 private key, mode 0600
    <state>/keys/<purpose>/chain/<N>.json     version N of the set, signed by version N-1 (N >= 2;
                                              common/trust/key_chain.py)

A rotation writes the new private key and the chain step first and then
replaces ``keyset.json`` atomically, under an exclusive lock, so a crash at any
point leaves a usable set. Processes that sign (the router) call
:meth:`KeyStore.load` again when the file's mtime changes or a waiting key's
time comes, so a rotation takes effect without a restart.

A rotated-in key verifies at once (collectors learn it through the chain) but
signs only after ``grace_s``: by then connected collectors hold it.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from common.config.state_dir import locked, write_private, write_public
from common.errors import ConfigError, FailedPrecondition
from common.trust import key_chain
from common.trust.key_chain import HeldSet
from common.trust.keys import DEFAULT_LIFETIME, KeyPurpose, KeySet, PublicKey, SigningKey

FORMAT = "versus-keyset/1"
# The threshold of every version this store writes: all private keys of a set live on one host,
# so more signatures would prove nothing more (the chain format allows more; key_chain.py).
THRESHOLD = 1


class KeyStore:
    """Load, create and rotate the key set of one purpose in ``<state>/keys/<purpose>``."""

    def __init__(self, state_dir: Path, purpose: KeyPurpose):
        self.purpose = purpose
        self.directory = state_dir / "keys" / purpose.value
        self.index = self.directory / "keyset.json"

    def exists(self) -> bool:
        return self.index.exists()

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads(self.index.read_text())
        return meta

    def version(self) -> int:
        """The version of the set (1 until the first rotation)."""
        return int(self._meta().get("version", 1))

    def held_set(self, now: int | None = None) -> HeldSet:
        """The newest version as a verifier holds it (what enrollment hands out)."""
        keyset = self.load(now)
        return HeldSet(self.purpose, keyset.version, THRESHOLD, {k.kid: k.public for k in keyset.keys})

    def chain(self, after: int) -> list[dict[str, Any]]:
        """The steps from version ``after`` to the newest, in order (empty when ``after`` is current).

        Raises :class:`ConfigError` when a step is missing (the chain was tampered with).
        """
        newest = self.version()
        steps = []
        for version in range(max(after, 1) + 1, newest + 1):
            try:
                steps.append(json.loads((self.directory / "chain" / f"{version}.json").read_text()))
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"{self.purpose.value} key chain step {version} is unreadable: {exc}"
                ) from None
        return steps

    def waiting_kid(self) -> str | None:
        """The key that will sign once its grace is over (None: no key is waiting)."""
        waiting = self._meta().get("next")
        return str(waiting["kid"]) if waiting else None

    def pending_activation(self) -> int | None:
        """When the key waiting to become current does (None: no key is waiting)."""
        waiting = self._meta().get("next")
        return int(waiting["activates_at"]) if waiting else None

    def load(self, now: int | None = None) -> KeySet:
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
            current = str(meta["current"])
            waiting = meta.get("next")
            if waiting and _now(now) >= int(waiting["activates_at"]):
                current = str(waiting["kid"])
            return KeySet(self.purpose, tuple(keys), current, int(meta.get("version", 1)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot load {self.purpose.value} keys from {self.directory}: {exc}") from None

    def load_or_create(self, now: int | None = None, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> KeySet:
        with locked(self.directory):
            if self.exists():
                return self.load()
            keyset = KeySet.create(self.purpose, _now(now), lifetime)
            self._save(keyset)
            return keyset

    def rotate(
        self, now: int | None = None, lifetime: dt.timedelta = DEFAULT_LIFETIME, grace_s: int = 0
    ) -> KeySet:
        """Publish a new version with a new key, current after ``grace_s``; older keys keep
        verifying until their not_after. The step is signed by every key of the old version."""
        at = _now(now)
        with locked(self.directory):
            if not self.exists():
                self._save(KeySet.create(self.purpose, at, lifetime), version=1)
            old = self.load(at)
            version = old.version
            rotated = old.rotate(at, lifetime)
            new_key = rotated.current
            keyset = (
                rotated if grace_s <= 0 else KeySet(self.purpose, rotated.keys, old.current_kid, version + 1)
            )
            self._publish(old, keyset, version + 1, at)
            waiting = {"kid": new_key.kid, "activates_at": at + grace_s} if grace_s > 0 else None
            self._save(keyset, version=version + 1, waiting=waiting)
            return keyset

    def retire(self, kid: str, now: int | None = None) -> KeySet:
        """Publish a new version without ``kid`` (it stops verifying once collectors hold it)."""
        at = _now(now)
        with locked(self.directory):
            old = self.load(at)
            version = old.version
            waiting = self._meta().get("next")
            if kid not in {k.kid for k in old.keys}:
                raise FailedPrecondition(
                    f"{kid} is not in the {self.purpose.value} set", code="key_not_found"
                )
            if kid == old.current_kid or (waiting and waiting["kid"] == kid):
                raise FailedPrecondition(
                    f"{kid} signs now (or is about to): rotate first", code="key_is_current"
                )
            keyset = KeySet(
                self.purpose, tuple(k for k in old.keys if k.kid != kid), old.current_kid, version + 1
            )
            self._publish(old, keyset, version + 1, at)
            self._save(keyset, version=version + 1, waiting=waiting)
            return keyset

    def _publish(self, old: KeySet, new: KeySet, version: int, now: int) -> None:
        """Write chain step ``version``: ``new`` signed by every key of ``old`` and of ``new``."""
        signers = {k.kid: k for k in (*old.keys, *new.keys)}
        step = key_chain.sign_step(
            self.purpose, version, THRESHOLD, [k.public for k in new.keys], list(signers.values()), now
        )
        # Keep the private keys of the new set before the index names them.
        for key in new.keys:
            self._write_private(key)
        write_public(self.directory / "chain" / f"{version}.json", (json.dumps(step) + "\n").encode())

    def mtime_ns(self) -> int:
        try:
            return self.index.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def _write_private(self, key: SigningKey) -> None:
        path = self.directory / f"{key.kid}.pem"
        if not path.exists():
            pem = key.private_key().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            write_private(path, pem)

    def _save(self, keyset: KeySet, *, version: int = 1, waiting: dict[str, Any] | None = None) -> None:
        for key in keyset.keys:
            self._write_private(key)
        meta: dict[str, Any] = {
            "format": FORMAT,
            "purpose": self.purpose.value,
            "version": version,
            "current": keyset.current_kid,
            "keys": [k.public.to_json() for k in keyset.keys],
        }
        if waiting:
            meta["next"] = waiting
        write_public(self.index, (json.dumps(meta, indent=2) + "\n").encode())
        # Private keys of keys dropped from the set are no longer needed.
        kept = {f"{k.kid}.pem" for k in keyset.keys}
        for stale in self.directory.glob("*.pem"):
            if stale.name not in kept:
                stale.unlink()


class ReloadingKeySet:
    """The current key set of a store, re-read when the store's index changes on disk.

    The mtime is checked at most every ``check_interval_s`` so signing stays cheap.
    """

    def __init__(self, store: KeyStore, check_interval_s: float = 2.0):
        self.store = store
        self.check_interval_s = check_interval_s
        self._keyset = store.load_or_create()
        self._mtime = store.mtime_ns()
        pending = store.pending_activation()
        self._activation = pending if pending is not None and time.time() < pending else None
        self._checked = time.monotonic()

    def get(self) -> KeySet:
        now = time.monotonic()
        if now - self._checked >= self.check_interval_s:
            self._checked = now
            mtime = self.store.mtime_ns()
            due = self._activation is not None and time.time() >= self._activation
            if mtime != self._mtime or due:
                self._keyset, self._mtime = self.store.load(), mtime
                pending = self.store.pending_activation()
                # load() applied a waiting key whose time came; only a future one is worth watching.
                self._activation = pending if pending is not None and time.time() < pending else None
        return self._keyset


def _now(now: int | None) -> int:
    return int(time.time()) if now is None else now
