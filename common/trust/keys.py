"""Ed25519 key sets: dispatch keys sign task envelopes, release keys sign upgrade manifests.

A key set holds several keys so it can rotate without a flag day: the newest
is *current* and signs; older keys keep verifying until their ``not_after``.
Private keys never appear in ``repr`` or logs. Persistence lives in
:mod:`common.trust.keystore`; this module is pure.
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ALG = "ed25519"
DEFAULT_LIFETIME = dt.timedelta(days=365)


class KeyPurpose(StrEnum):
    DISPATCH = "dispatch"
    RELEASE = "release"

    @property
    def kid_prefix(self) -> str:
        return "dsp" if self is KeyPurpose.DISPATCH else "rel"


def rfc3339(epoch_s: int) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ`` for a Unix time in seconds."""
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> int:
    """Unix seconds from an RFC 3339 timestamp (any offset, fractional seconds truncated)."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no offset")
    return int(value.timestamp())


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A verification key as published to collectors."""

    kid: str
    public: bytes
    not_after: int
    alg: str = ALG
    _key: Ed25519PublicKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.alg != ALG:
            raise ValueError(f"unsupported key algorithm {self.alg!r}")
        object.__setattr__(self, "_key", Ed25519PublicKey.from_public_bytes(self.public))

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            self._key.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def expired(self, now: int) -> bool:
        return now > self.not_after

    def to_json(self) -> dict[str, Any]:
        """The enrollment-response form: ``{"kid", "alg", "pub" (base64), "not_after" (RFC 3339)}``."""
        return {
            "kid": self.kid,
            "alg": self.alg,
            "pub": base64.b64encode(self.public).decode("ascii"),
            "not_after": rfc3339(self.not_after),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PublicKey:
        return cls(
            kid=str(obj["kid"]),
            alg=str(obj.get("alg", ALG)),
            public=base64.b64decode(str(obj["pub"]), validate=True),
            not_after=parse_rfc3339(str(obj["not_after"])),
        )


class SigningKey:
    """A private Ed25519 key with its kid and expiry. ``repr`` never shows key material."""

    __slots__ = ("_private", "kid", "not_after", "public")

    def __init__(self, kid: str, private: Ed25519PrivateKey, not_after: int):
        self.kid = kid
        self.not_after = not_after
        self._private = private
        raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public = PublicKey(kid=kid, public=raw, not_after=not_after)

    @classmethod
    def generate(cls, purpose: KeyPurpose, now: int, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> SigningKey:
        day = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y%m%d")
        kid = f"{purpose.kid_prefix}-{day}-{secrets.token_hex(4)}"
        return cls(kid, Ed25519PrivateKey.generate(), now + int(lifetime.total_seconds()))

    @classmethod
    def from_seed(cls, kid: str, seed: bytes, not_after: int) -> SigningKey:
        return cls(kid, Ed25519PrivateKey.from_private_bytes(seed), not_after)

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def private_key(self) -> Ed25519PrivateKey:
        """The key object, for persistence only."""
        return self._private

    def __repr__(self) -> str:
        return f"SigningKey(kid={self.kid!r}, not_after={rfc3339(self.not_after)}, private=[REDACTED])"


@dataclass(frozen=True, slots=True)
class KeySet:
    """The keys of one purpose; ``current_kid`` signs, every unexpired key verifies."""

    purpose: KeyPurpose
    keys: tuple[SigningKey, ...]
    current_kid: str
    # Which version of the set this is (common/trust/key_chain.py): 1 until the first rotation.
    version: int = 1

    def __post_init__(self) -> None:
        kids = [k.kid for k in self.keys]
        if len(set(kids)) != len(kids):
            raise ValueError("duplicate kid in key set")
        if self.current_kid not in kids:
            raise ValueError(f"current kid {self.current_kid!r} is not in the set")

    @classmethod
    def create(cls, purpose: KeyPurpose, now: int, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> KeySet:
        key = SigningKey.generate(purpose, now, lifetime)
        return cls(purpose, (key,), key.kid)

    @property
    def current(self) -> SigningKey:
        for key in self.keys:
            if key.kid == self.current_kid:
                return key
        raise AssertionError("unreachable: checked in __post_init__")

    def rotate(self, now: int, lifetime: dt.timedelta = DEFAULT_LIFETIME) -> KeySet:
        """A new current key; older keys stay until their ``not_after``, expired ones are dropped."""
        key = SigningKey.generate(self.purpose, now, lifetime)
        kept = tuple(k for k in self.keys if not k.public.expired(now))
        return KeySet(self.purpose, (*kept, key), key.kid, self.version + 1)

    def signing_key_for(self, held: Collection[str] | None, now: int) -> SigningKey | None:
        """The key to sign for a verifier that trusts the kids in ``held``.

        The current key when the verifier holds it; otherwise the newest unexpired key it
        holds; None when it holds none of this set's live keys (it cannot verify anything we
        sign). ``held`` None means unknown — a verifier enrolled before kids were recorded —
        and gets the current key.
        """
        if held is None:
            return self.current
        usable = [k for k in self.keys if k.kid in held and not k.public.expired(now)]
        if not usable:
            return None
        return max(usable, key=lambda k: (k.kid == self.current_kid, k.not_after))

    def public_keys(self, now: int) -> list[PublicKey]:
        """Keys a verifier should trust now, current first."""
        live = [k.public for k in self.keys if not k.public.expired(now)]
        return sorted(live, key=lambda p: (p.kid != self.current_kid, -p.not_after))


def trusted(keys: Iterable[PublicKey]) -> dict[str, PublicKey]:
    """A kid-indexed trust set for the verifier."""
    return {k.kid: k for k in keys}
