"""The trust bundle collectors hold: which Collector CAs and gateway CAs, and its version.

Enrollment hands it out, the router delivers newer versions in claim answers
(signed; router/trust/collector_docs.py) and the gateway serves the gateway CAs at
``/trust`` for enroll-command pins. All three build it here, from the CA store
(common/trust/ca_store.py) and, where the operator supplies a CA by file, from that
file instead:

- ``VERSUS_COLLECTOR_CA_CERT_FILE``: that CA is the only Collector CA (rotating it is the operator's);
- ``VERSUS_GATEWAY_CA_FILE``: the gateway CAs are the certificates in that file;
- operator-supplied gateway certificate without a CA file: the gateway is publicly trusted, the
  bundle carries no gateway CA - except with shared key material (common/material/shared.py), where the
  gateways' certificates are issued from the store's gateway CA by `versus-cp ca issue-server-cert`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509

from common.config.settings import KeyMaterialMode, Settings
from common.trust import pki
from common.trust.ca_store import CaStore, ReloadingTrust, Trust
from common.trust.pki import spki_pin

GatewaySource = Literal["store", "file", "none"]


@dataclass(frozen=True, slots=True)
class Bundle:
    version: int
    collector: tuple[str, ...]
    gateway: tuple[str, ...]
    # Gateway CAs certified by their predecessor (common/trust/pki.py successors).
    cross: tuple[str, ...]
    # The Collector CA that issues now: a collector whose certificate another CA issued renews early.
    collector_active: str
    # The pin of the gateway CA that issues the gateway's certificate now (None: publicly trusted).
    gateway_pin: str | None

    def pem(self) -> str:
        return "".join(self.collector + self.gateway)


class BundleSource:
    """The newest :class:`Bundle`, rebuilt when the CA store changes."""

    def __init__(
        self,
        store: CaStore,
        *,
        collector_ca_pem: str | None = None,
        gateway: GatewaySource = "store",
        gateway_file_pem: str = "",
        check_interval_s: float = 1.0,
    ):
        self.store = store
        self.trust = ReloadingTrust(store, check_interval_s)
        self._collector_pem = collector_ca_pem
        self._gateway = gateway
        self._gateway_file_pem = gateway_file_pem
        self._cached: Bundle | None = None

    @classmethod
    def from_settings(cls, settings: Settings, state: Path) -> BundleSource:
        collector = settings.collector_ca_cert_file
        gateway: GatewaySource = "store" if settings.gateway_tls else "none"
        file_pem = ""
        if settings.gateway_ca_file is not None:
            gateway, file_pem = "file", settings.gateway_ca_file.read_text()
        elif settings.tls_cert_file is not None and settings.key_material is KeyMaterialMode.LOCAL:
            gateway = "none"
        return cls(
            CaStore(state),
            collector_ca_pem=collector.read_text() if collector is not None else None,
            gateway=gateway,
            gateway_file_pem=file_pem,
        )

    @property
    def collector_ca_supplied(self) -> bool:
        return self._collector_pem is not None

    def get(self) -> Bundle:
        trust = self.trust.get()
        if self._cached is None or self._cached.version != trust.version:
            self._cached = self._build(trust)
        return self._cached

    def _build(self, trust: Trust) -> Bundle:
        collector: tuple[str, ...]
        if self._collector_pem is not None:
            collector = (self._collector_pem,)
            active = pki.ca_id(x509.load_pem_x509_certificate(self._collector_pem.encode()))
        else:
            collector, active = tuple(trust.pems("collector")), trust.active["collector"]
        gateway: tuple[str, ...] = ()
        cross: tuple[str, ...] = ()
        pin = None
        if self._gateway == "store":
            gateway, cross = tuple(trust.pems("gateway")), tuple(trust.cross_pems("gateway"))
            pin = spki_pin(trust.active_entry("gateway").cert)
        elif self._gateway == "file":
            certs = x509.load_pem_x509_certificates(self._gateway_file_pem.encode())
            gateway = tuple(pki.cert_pem(c).decode("ascii") for c in certs)
            pin = spki_pin(certs[0])
        return Bundle(trust.version, collector, gateway, cross, active, pin)
