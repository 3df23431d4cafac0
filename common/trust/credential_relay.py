"""A device credential relayed to one collector for one dispatch (vault mode B, protocol 6).

The router encrypts the credential to the collector's own P-256 key (the one its certificate
and bearer tokens use): an ephemeral ECDH key, HKDF-SHA256 over the shared secret with the
collector and dispatch ids as context, AES-256-GCM with the collector id, dispatch id and
credential reference as associated data. So only that collector can open it, and only as the
credential of that dispatch: one relayed for another dispatch or another collector does not
open (``credential_relay_invalid``). The result travels as a signed document
(common/trust/signed_doc.py, type ``relayed_credential``) signed with the dispatch key the envelope
is signed with, so nothing between the router and the collector can substitute its own
ciphertext, and a proxy on the path sees only ciphertext.

Pure code: the caller supplies the keys.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.trust import b64url

KIND = "relayed_credential"
_INFO = b"versus relayed credential v1"


class RelayError(ValueError):
    """A relayed credential that does not open; ``code`` is stable."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = "credential_relay_invalid"


def _key(shared: bytes, collector_id: str, dispatch_id: str) -> bytes:
    info = _INFO + b"\n" + collector_id.encode() + b"\n" + dispatch_id.encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def _aad(collector_id: str, dispatch_id: str, ref: str) -> bytes:
    return json.dumps([KIND, collector_id, dispatch_id, ref]).encode()


def seal_for(
    collector_key: ec.EllipticCurvePublicKey,
    collector_id: str,
    dispatch_id: str,
    ref: str,
    value: Mapping[str, Any],
) -> dict[str, str]:
    """The payload fields (to sign) that carry ``value`` to ``collector_id`` for ``dispatch_id``."""
    ephemeral = ec.generate_private_key(ec.SECP256R1())
    key = _key(ephemeral.exchange(ec.ECDH(), collector_key), collector_id, dispatch_id)
    nonce = os.urandom(12)
    plaintext = json.dumps(dict(value), separators=(",", ":"), sort_keys=True).encode()
    epk = ephemeral.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return {
        "dispatch_id": dispatch_id,
        "credential_ref": ref,
        "epk": b64url.encode(epk),
        "nonce": b64url.encode(nonce),
        "ciphertext": b64url.encode(
            AESGCM(key).encrypt(nonce, plaintext, _aad(collector_id, dispatch_id, ref))
        ),
    }


def open_for(
    private_key: ec.EllipticCurvePrivateKey, collector_id: str, dispatch_id: str, payload: Mapping[str, Any]
) -> dict[str, Any]:
    """The credential in ``payload``, if it was sealed for this collector and this dispatch."""
    if payload.get("dispatch_id") != dispatch_id:
        raise RelayError("the relayed credential is for another dispatch")
    try:
        epk = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b64url.decode(str(payload["epk"])))
        nonce, ciphertext = b64url.decode(str(payload["nonce"])), b64url.decode(str(payload["ciphertext"]))
        ref = str(payload["credential_ref"])
        key = _key(private_key.exchange(ec.ECDH(), epk), collector_id, dispatch_id)
        plaintext = AESGCM(key).decrypt(nonce, ciphertext, _aad(collector_id, dispatch_id, ref))
        value = json.loads(plaintext)
    except (KeyError, ValueError, TypeError, InvalidTag):
        raise RelayError(
            "the relayed credential does not open with this collector's key for this dispatch"
        ) from None
    if not isinstance(value, dict):
        raise RelayError("the relayed credential is not a JSON object")
    return value
