"""Vault mode C's settings, apart from the client (collector/external_vault.py, which needs hvac).

What the signed config says about the customer's Vault, the stable error every Vault failure
becomes, which change of settings makes the collector restart, and where in the KV mount a
device's credential lives. Plain values and functions: a collector not in mode C loads this and
never the Vault client's libraries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SECRET_FILE = "vault-secret-id.sealed"  # noqa: S105 - a file name
# KV paths are built from a provider and a target_ref: plain segments only.
_SEGMENT = re.compile(r"[A-Za-z0-9_@:.-]+")


class VaultError(Exception):
    """Vault could not supply a credential; ``code`` is stable (the task fails with it)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class VaultSettings:
    """The integration as the signed config names it, and the encrypted secret id."""

    integration_id: str
    address: str
    role_id: str
    kv_mount: str
    path_prefix: str
    ca_pem: str
    delivery: str
    secret: Mapping[str, Any] | None

    def __repr__(self) -> str:
        return f"VaultSettings({self.integration_id!r}, {self.address!r})"

    @property
    def secret_version(self) -> int:
        version = (self.secret or {}).get("version")
        return version if isinstance(version, int) else 0

    @classmethod
    def from_config(cls, vault: Mapping[str, Any]) -> VaultSettings:
        """The settings in a config's ``vault``; :class:`VaultError` when they are incomplete."""
        values = {k: vault.get(k) for k in ("integration_id", "address", "role_id", "kv_mount")}
        if not all(isinstance(v, str) and v for v in values.values()):
            raise VaultError("vault_config_invalid", "the config names no complete Vault integration")
        secret = vault.get("secret")
        return cls(
            integration_id=str(values["integration_id"]), address=str(values["address"]),
            role_id=str(values["role_id"]), kv_mount=str(values["kv_mount"]),
            path_prefix=str(vault.get("path_prefix") or "versus"), ca_pem=str(vault.get("ca_pem") or ""),
            delivery=str(vault.get("secret_id_delivery") or "wrapped"),
            secret=secret if isinstance(secret, Mapping) else None,
        )  # fmt: skip


def settings_key(vault: Mapping[str, Any]) -> dict[str, Any]:
    """What of a config's vault settings decides whether the collector restarts: everything but
    the secret's ciphertext, which differs with every delivery of the same secret."""
    out = {k: v for k, v in vault.items() if k != "secret"}
    secret = vault.get("secret")
    if isinstance(secret, Mapping):
        out["secret_version"] = secret.get("version")
    return out


def secret_path(prefix: str, provider: str, target_ref: str) -> str:
    """The KV v2 path of a device's credential; :class:`VaultError` for a reference that is not a
    plain path (no empty, ``.`` or ``..`` segment, nothing a URL would read as syntax)."""
    parts = [*prefix.split("/"), provider, *target_ref.split("/")]
    if not all(_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts):
        raise VaultError("vault_path_invalid", f"{provider}/{target_ref!r} does not name a Vault path")
    return "/".join(parts)
