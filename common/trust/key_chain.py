"""In-band rotation of a key set: each new version is signed by the one before it (as TUF rotates root).

Version 1 of a set (dispatch or release) is what a collector pins at
enrollment. Each later version is a document listing the whole new set and its
threshold, signed by at least ``threshold`` keys of the previous version (the
authority to change the set) and by ``threshold`` keys of the new version
(proof that whoever publishes it holds them)::

    {"payload": "<base64url JSON>", "signatures": [{"kid": "dsp-…", "sig": "<base64url Ed25519>"}, …]}

    payload: {"type": "key_set", "purpose": "dispatch", "version": 3, "threshold": 1,
              "issued_at": 1800000000, "keys": [{"kid", "alg", "pub", "not_after"}, …]}

A collector that missed several rotations walks the chain from the version it
holds, one step at a time, each step verified with the keys of the step before.
Keys of the previous version count for signing a step even if they have
expired since: what matters is that they were trusted at that version. A step
that does not verify stops the walk; the collector keeps the last good set.

Pure code.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.trust import b64url
from common.trust.keys import KeyPurpose, PublicKey, SigningKey

DOMAIN = b"versus-key-set-v1\n"
MAX_STEP_CHARS = 64 * 1024


class ChainError(Exception):
    """A rotation step was refused; ``code`` is stable."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class HeldSet:
    """A version of a key set as a verifier holds it."""

    purpose: KeyPurpose
    version: int
    threshold: int
    keys: Mapping[str, PublicKey]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "threshold": self.threshold,
            "keys": [k.to_json() for k in self.keys.values()],
        }


def sign_step(
    purpose: KeyPurpose,
    version: int,
    threshold: int,
    keys: Sequence[PublicKey],
    signers: Sequence[SigningKey],
    now: int,
) -> dict[str, Any]:
    """The document publishing ``keys`` as ``version`` of the set, signed by every key in ``signers``."""
    payload = {
        "type": "key_set",
        "purpose": purpose.value,
        "version": version,
        "threshold": threshold,
        "issued_at": now,
        "keys": [k.to_json() for k in keys],
    }
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    signatures = [{"kid": s.kid, "sig": b64url.encode(s.sign(DOMAIN + raw))} for s in signers]
    return {"payload": b64url.encode(raw), "signatures": signatures}


def step_kids(document: Mapping[str, Any]) -> list[str]:
    """The kids a step publishes, read without verifying it: for the publisher's own chain files."""
    payload = json.loads(b64url.decode(str(document["payload"])))
    return [str(k["kid"]) for k in payload["keys"]]


def _signers(raw: bytes, signatures: object, keys: Mapping[str, PublicKey]) -> set[str]:
    """The kids of ``keys`` whose signature over ``raw`` verifies (each kid counted once)."""
    good: set[str] = set()
    if not isinstance(signatures, list):
        return good
    for entry in signatures:
        if not isinstance(entry, Mapping):
            continue
        kid, sig = entry.get("kid"), entry.get("sig")
        key = keys.get(kid) if isinstance(kid, str) else None
        if key is None or not isinstance(sig, str):
            continue
        try:
            if key.verify(b64url.decode(sig), DOMAIN + raw):
                good.add(key.kid)
        except (binascii.Error, ValueError):
            continue
    return good


def verify_step(held: HeldSet, document: object) -> HeldSet:
    """The next version of ``held`` if ``document`` is a valid step from it; else :class:`ChainError`."""
    if not isinstance(document, Mapping) or not isinstance(document.get("payload"), str):
        raise ChainError("key_set_malformed", "a key set step is an object with a payload")
    if len(document["payload"]) > MAX_STEP_CHARS:
        raise ChainError("key_set_malformed", "the key set step is too large")
    try:
        raw = b64url.decode(document["payload"])
        payload = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        raise ChainError("key_set_malformed", "the payload is not base64url JSON") from None
    if not isinstance(payload, dict) or payload.get("type") != "key_set":
        raise ChainError("key_set_malformed", "the payload is not a key set")
    if payload.get("purpose") != held.purpose.value:
        raise ChainError("key_set_wrong_purpose", f"expected a {held.purpose.value} key set")
    version, threshold = payload.get("version"), payload.get("threshold")
    if not isinstance(version, int) or isinstance(version, bool) or version != held.version + 1:
        raise ChainError("key_set_out_of_order", f"expected version {held.version + 1}, got {version!r}")
    try:
        keys = {k.kid: k for k in (PublicKey.from_json(e) for e in payload["keys"])}
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise ChainError("key_set_malformed", "the keys of the new set do not parse") from None
    if not isinstance(threshold, int) or isinstance(threshold, bool) or not 1 <= threshold <= len(keys):
        raise ChainError("key_set_malformed", "the threshold must be between 1 and the number of keys")
    if len(_signers(raw, document.get("signatures"), held.keys)) < held.threshold:
        raise ChainError(
            "key_set_not_authorized",
            f"fewer than {held.threshold} keys of version {held.version} signed version {version}",
        )
    if len(_signers(raw, document.get("signatures"), keys)) < threshold:
        raise ChainError("key_set_unproven", f"fewer than {threshold} keys of version {version} signed it")
    return HeldSet(held.purpose, version, threshold, keys)


def walk(held: HeldSet, steps: Sequence[object]) -> tuple[HeldSet, ChainError | None]:
    """Apply ``steps`` in order from ``held``: the last good set, and the error that stopped the walk."""
    current = held
    for step in steps:
        try:
            current = verify_step(current, step)
        except ChainError as exc:
            return current, exc
    return current, None
