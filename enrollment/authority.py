"""Which Collector CA issues, and the trust bundle handed out with what it issues.

During a Collector CA rotation (docs/day2.md) the active CA changes while
collectors still hold certificates of the old one; a chain handed back always
ends in the CA that actually issued its leaf.
"""

from __future__ import annotations

from collections.abc import Callable

from cryptography import x509

from common.trust import pki
from common.trust.ca_store import CaStore
from common.trust.pki import spki_pin
from common.trust.trust_bundle import Bundle, BundleSource
from enrollment.ca import CollectorCA


class Authority:
    """The issuing :class:`CollectorCA` and the current :class:`Bundle`."""

    def __init__(self, bundle: Callable[[], Bundle], issuing: Callable[[], CollectorCA]):
        self.bundle = bundle
        self.issuing = issuing

    @classmethod
    def from_source(cls, source: BundleSource, supplied: CollectorCA | None = None) -> Authority:
        """The active CA of ``source``'s store (re-read after an activation), or the operator's."""
        if supplied is not None:
            return cls(source.get, lambda: supplied)
        cache: dict[str, CollectorCA] = {}
        store: CaStore = source.store

        def issuing() -> CollectorCA:
            trust = source.trust.get()
            active = trust.active["collector"]
            if active not in cache:
                cache.clear()
                cache[active] = CollectorCA(
                    trust.active_entry("collector").cert, store.private_key("collector", active)
                )
            return cache[active]

        return cls(source.get, issuing)

    @classmethod
    def fixed(cls, ca: CollectorCA, gateway_ca_pem: str | None = None) -> Authority:
        """One CA and an unchanging bundle (version 1)."""
        gateway = tuple(
            pki.cert_pem(c).decode("ascii")
            for c in (x509.load_pem_x509_certificates(gateway_ca_pem.encode()) if gateway_ca_pem else [])
        )
        pin = spki_pin(x509.load_pem_x509_certificate(gateway[0].encode())) if gateway else None
        bundle = Bundle(1, (ca.cert_pem,), gateway, (), pki.ca_id(ca.cert), pin)
        return cls(lambda: bundle, lambda: ca)

    def chain_pem(self, leaf_pem: str) -> str:
        """``leaf_pem`` followed by the CA that issued it (when the bundle still holds that CA)."""
        issuer = pki.issuer_id(x509.load_pem_x509_certificate(leaf_pem.encode()))
        for pem in self.bundle().collector:
            if pki.ca_id(x509.load_pem_x509_certificate(pem.encode())) == issuer:
                return leaf_pem + pem
        return leaf_pem
