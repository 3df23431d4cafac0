"""Vault mode C: each collector's AppRole secret id, from the operator to that collector only.

The operator hands the router a secret id per collector (``SetVaultMode``): a response-wrapping
token where the integration delivers them wrapped (the default), the secret id itself where the
customer's Vault does not allow wrapping. PostgreSQL keeps it sealed under the credentials
master key (router/credentials/vault.py, the same envelope encryption as mode B's store), bound
to the collector and the secret's version. The signed config carries it to the collector
encrypted to the collector's own key (common/trust/credential_relay.py, with the secret's version as
context), so a proxy on the path, a log or a stolen config file sees ciphertext only.

A wrapping token is single use: once the collector unwrapped it, the copy here opens to
nothing anyone can use, and if someone else unwrapped it first the collector's unwrap fails
and it says so (``vault_secret_id_unwrap_failed``) - the point of wrapping.

Pure code: keys and values come in, text and documents go out.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from common.trust.credential_relay import seal_for
from router.credentials.vault import (
    CredentialUnreadable,
    MasterKeys,
    SealedCredential,
    open_value,
    seal_value,
)

DELIVERIES = ("wrapped", "plain")
# A response-wrapping token is ~95 characters and a secret id a UUID: anything this long is a mistake.
MAX_SECRET_CHARS = 1000
# The reference a collector's secret is sealed under (the tenant is left empty: these are not
# device credentials, and a device credential's reference always names a provider).
_REF = "vault-secret-id:{collector_id}"
# What the relayed secret is bound to, in place of a dispatch id (common/trust/credential_relay.py).
CONTEXT = "vault-secret-id:v{version}"
CREDENTIAL_REF = "vault:secret_id"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def seal_stored(master: MasterKeys, collector_id: str, version: int, secret_id: str) -> str:
    """The text PostgreSQL keeps for ``secret_id`` (``collectors.vault_secret``)."""
    sealed = seal_value(master, "", _REF.format(collector_id=collector_id), version, {"secret_id": secret_id})
    return json.dumps(
        {"kid": sealed.key_id, "wrapped": _b64(sealed.wrapped_key), "nonce": _b64(sealed.nonce),
         "ct": _b64(sealed.ciphertext)},
        separators=(",", ":"),
    )  # fmt: skip


def open_stored(master: MasterKeys, collector_id: str, version: int, text: str) -> str:
    """The secret id (or wrapping token) in ``text``; :class:`CredentialUnreadable` when it does not open."""
    try:
        doc = json.loads(text)
        sealed = SealedCredential(
            str(doc["kid"]), base64.b64decode(doc["wrapped"]), base64.b64decode(doc["nonce"]),
            base64.b64decode(doc["ct"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):
        raise CredentialUnreadable("the stored vault secret id is damaged") from None
    value = open_value(master, "", _REF.format(collector_id=collector_id), version, sealed)
    return str(value.get("secret_id", ""))


def check_secret(value: str) -> str:
    """``value`` stripped of surrounding whitespace (a pasted token ends in a newline), or ValueError."""
    secret = value.strip()
    if not secret or len(secret) > MAX_SECRET_CHARS or any(c.isspace() for c in secret):
        raise ValueError(f"a secret id is one word of 1 to {MAX_SECRET_CHARS} characters")
    return secret


def for_collector(
    public_key: ec.EllipticCurvePublicKey, collector_id: str, version: int, delivery: str, secret_id: str
) -> dict[str, Any]:
    """The config's ``vault.secret``: the secret encrypted to the collector for this version."""
    sealed = seal_for(
        public_key, collector_id, CONTEXT.format(version=version), CREDENTIAL_REF, {"secret_id": secret_id}
    )
    return {"version": version, "delivery": delivery, **sealed}
