"""The collector's state directory: its identity, key, certificates, pinned key sets and policy.

    identity.json      collector_id, site_id, status, gateway URL/addresses/server name, auth
    key.pem            the collector's private key (0600); signs ES256 bearer tokens
    cert.pem           certificate chain issued by the Collector CA
    ca-bundle.pem      CAs to trust: Collector CAs and the gateway's internal CAs (managed: rewritten
                       by signed bundles, collector/trust.py)
    trust.json         the version of that bundle and the Collector CA that issues now
    extra-ca.pem       optional, the operator's: more CAs to trust (a TLS-inspecting proxy's); never
                       rewritten by the collector
    keys.json          dispatch and release verification key sets, pinned at enrollment
    policy.json        vault mode, heartbeat interval, concurrency limits
    credentials.sealed device credentials in vault mode A (collector/credentials.py)
    vault-secret-id.sealed  vault mode C: the AppRole secret id, unwrapped once
    vault-ca.pem       vault mode C: the CA behind the Vault's TLS certificate (collector/external_vault.py)

Secret files are written 0600 and atomically; nothing here is ever logged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from common.config.state_dir import write_private, write_public

# Set by the supervisor in its child's environment (collector/supervisor).
SUPERVISED_ENV = "VERSUS_COLLECTOR_SUPERVISED"


@dataclass(frozen=True, slots=True)
class StatePaths:
    root: Path

    @property
    def identity(self) -> Path:
        return self.root / "identity.json"

    @property
    def key(self) -> Path:
        return self.root / "key.pem"

    @property
    def cert(self) -> Path:
        return self.root / "cert.pem"

    @property
    def ca_bundle(self) -> Path:
        return self.root / "ca-bundle.pem"

    @property
    def extra_ca(self) -> Path:
        return self.root / "extra-ca.pem"

    @property
    def keys(self) -> Path:
        return self.root / "keys.json"

    @property
    def policy(self) -> Path:
        return self.root / "policy.json"

    @property
    def config(self) -> Path:
        """The signed config (collector/signed_config.py); it names the upgrade target."""
        return self.root / "config.json"

    @property
    def runtime(self) -> Path:
        """Written after every answered claim: the supervisor's health check reads it."""
        return self.root / "runtime.json"

    @property
    def update_status(self) -> Path:
        """The supervisor's last upgrade report; the collector sends it with its claims."""
        return self.root / "update-status.json"

    @property
    def attempt(self) -> Path:
        """Written before an enrollment request so a retry reuses the same id and key."""
        return self.root / "enroll-attempt.json"


def write_json(path: Path, value: Any, *, private: bool = False) -> None:
    data = (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()
    (write_private if private else write_public)(path, data)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def save_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} is not an EC private key")
    return key
