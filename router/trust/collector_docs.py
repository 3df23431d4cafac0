"""The signed documents the router hands a collector besides envelopes: its config and tunnel offers.

Both are signed with a dispatch key the collector holds (common/trust/signed_doc.py),
chosen as for envelopes (``KeySet.signing_key_for``). Pure code: rows and keys
come in, wire documents go out.

**Config.** ``collectors.config_version`` starts at 0 (the policy from
enrollment, no document) and goes up by one with every recorded change an
operator makes (the vault mode and Vault integration) and with every change of its upgrade
target (router/releases/updates.py). A claim names the
version the collector runs; when PostgreSQL holds a newer one the claim is
answered with the signed document and no work, and the collector applies it
(docs/day2.md). Documents are signed when delivered and expire soon after, so a
captured one cannot be replayed later; the version keeps an older one from
ever replacing a newer one.

**Tunnel offers** expire shortly after the offer's own wait.

**Trust bundles** (the CAs a collector trusts, common/trust/trust_bundle.py) carry
the store's version, which only goes up; like a config they are signed when
delivered (router/trust/delivery.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from common.trust import signed_doc
from common.trust.keys import KeySet
from common.trust.trust_bundle import Bundle

# A config document is signed when it is delivered; this only has to cover the trip and clock skew.
CONFIG_LIFETIME_S = 15 * 60
# Offers wait 30 s for the collector's dial-back (router/tunnels/broker.py); the document a little longer.
OFFER_LIFETIME_S = 90


def config_payload(
    collector_id: str, row: Any, now: int, secret: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The config document for ``row`` (a collectors row joined with its Vault integration);
    ``secret``: mode C's AppRole secret id, already encrypted to the collector
    (router/credentials/vault_secrets.py)."""
    vault: dict[str, Any] = {}
    if row["vault_mode"] == "external":
        vault = {
            "integration_id": str(row["vault_integration_id"] or ""),
            "address": str(row["address"] or ""),
            "role_id": str(row["role_id"] or ""),
            "kv_mount": str(row["kv_mount"] or ""),
            "path_prefix": str(row["path_prefix"] or ""),
            "ca_pem": str(row["ca_pem"] or ""),
            "secret_id_delivery": str(row["secret_id_delivery"] or ""),
        }
        if secret is not None:
            vault["secret"] = dict(secret)
    update = None
    if row.get("target_name"):
        # The release the collector's supervisor installs (docs/upgrades.md); it fetches and
        # verifies the artifact through the update repository, which signs name, length and hash.
        update = {
            "version": str(row["target_version"]),
            "target": str(row["target_name"]),
            "sha256": str(row["target_sha256"]),
            "length": int(row["target_length"]),
        }
    return {
        "type": signed_doc.COLLECTOR_CONFIG,
        "collector_id": collector_id,
        "version": int(row["config_version"]),
        "issued_at": now,
        "expires_at": now + CONFIG_LIFETIME_S,
        "vault_mode": str(row["vault_mode"]),
        "vault": vault,
        "update": update,
    }


def offer_payload(collector_id: str, offer: Mapping[str, Any], now: int) -> dict[str, Any]:
    return {
        "type": signed_doc.TUNNEL_OFFER,
        "collector_id": collector_id,
        "session_id": str(offer["session_id"]),
        "host": str(offer["host"]),
        "port": int(offer["port"]),
        "issued_at": now,
        "expires_at": now + OFFER_LIFETIME_S,
    }


def trust_payload(collector_id: str, bundle: Bundle, now: int) -> dict[str, Any]:
    return {
        "type": signed_doc.CA_BUNDLE,
        "collector_id": collector_id,
        "version": bundle.version,
        "issued_at": now,
        "expires_at": now + CONFIG_LIFETIME_S,
        "collector_cas": list(bundle.collector),
        "gateway_cas": list(bundle.gateway),
        "collector_active": bundle.collector_active,
    }


def sign_for(
    keys: KeySet, held: Collection[str] | None, payload: Mapping[str, Any], now: int
) -> dict[str, str] | None:
    """The signed document, or None when the collector holds no live dispatch key (it could not
    verify it; such a collector gets no work either, see ``no_collector_holds_a_live_dispatch_key``)."""
    key = keys.signing_key_for(held, now)
    return None if key is None else signed_doc.sign(key, payload)
