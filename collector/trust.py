"""The CAs the collector trusts (``ca-bundle.pem``) and how a newer set arrives in-band.

Enrollment writes version N of the trust bundle (the Collector CAs and the
gateway's CAs). A later version arrives in a claim answer as a signed document
(common/trust/signed_doc.py, type ``ca_bundle``): it replaces ``ca-bundle.pem`` only if
it verifies with a pinned dispatch key, is for this collector, has not expired
and is newer than the version held. The renewal answer also carries a bundle,
which is never used: anything on the path could have written it.

``trust.json`` holds the version and the Collector CA that issues now; when that
is not the issuer of the collector's certificate, the certificate is renewed
soon (collector/renewal.py), so a Collector CA rotation reissues every live leaf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from collector.state import StatePaths, read_json, write_json
from common.config.state_dir import write_public
from common.trust import pki, signed_doc
from common.trust.keys import PublicKey
from common.trust.signed_doc import DocumentError

# More CAs than a rotation needs (old, new, and one more started early) is not a bundle we asked for.
MAX_CAS_PER_KIND = 4


@dataclass(frozen=True, slots=True)
class TrustChange:
    version: int
    # CAs (by ca_id) that are now trusted and were not, and that were trusted and are not any more.
    added: frozenset[str]
    removed: frozenset[str]


class TrustStore:
    """``trust.json`` and ``ca-bundle.pem`` in the collector's state directory."""

    def __init__(self, paths: StatePaths, collector_id: str, trusted: Mapping[str, PublicKey]):
        self.paths = paths
        self.path = paths.root / "trust.json"
        self.collector_id = collector_id
        self.trusted = trusted
        # Collectors enrolled before in-band bundles have no trust.json: version 0 asks for the newest.
        held = read_json(self.path) if self.path.exists() else {}
        self.version = int(held.get("version", 0))
        self.collector_active: str = str(held.get("collector_active", ""))

    @staticmethod
    def write_enrolled(paths: StatePaths, version: int, bundle_pem: str, cert_chain_pem: str) -> None:
        """What enrollment handed out (over the pinned connection)."""
        write_public(paths.ca_bundle, bundle_pem.encode())
        leaf = x509.load_pem_x509_certificates(cert_chain_pem.encode())[0]
        write_json(paths.root / "trust.json", {"version": version, "collector_active": pki.issuer_id(leaf)})

    def accept(self, document: object, now: int) -> TrustChange:
        """Verify ``document`` and, if newer, make it the bundle; raises :class:`DocumentError`."""
        payload = signed_doc.verify(
            document, self.trusted, kind=signed_doc.CA_BUNDLE, collector_id=self.collector_id, now=now
        )
        version, active = payload.get("version"), payload.get("collector_active")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise DocumentError("document_malformed", "version must be a positive integer")
        if not isinstance(active, str):
            raise DocumentError("document_malformed", "collector_active must be a CA id")
        if version <= self.version:
            raise DocumentError(
                "trust_version_not_newer", f"trust bundle {version} is not newer than the held {self.version}"
            )
        collector = _cas(payload.get("collector_cas"), "collector_cas", required=True)
        gateway = _cas(payload.get("gateway_cas"), "gateway_cas", required=False)
        before = _ids(self.paths.ca_bundle)
        bundle = "".join(pki.cert_pem(c).decode("ascii") for c in collector + gateway)
        write_public(self.paths.ca_bundle, bundle.encode())
        write_json(self.path, {"version": version, "collector_active": active})
        self.version, self.collector_active = version, active
        after = {pki.ca_id(c) for c in collector + gateway}
        return TrustChange(version, frozenset(after - before), frozenset(before - after))

    def pem_of(self, ca_ids: frozenset[str]) -> str:
        """The certificates of ``ca_ids`` in the held bundle, PEM."""
        certs = x509.load_pem_x509_certificates(self.paths.ca_bundle.read_bytes())
        return "".join(pki.cert_pem(c).decode("ascii") for c in certs if pki.ca_id(c) in ca_ids)


def _cas(value: Any, field: str, *, required: bool) -> list[x509.Certificate]:
    if not isinstance(value, list) or len(value) > MAX_CAS_PER_KIND or (required and not value):
        raise DocumentError("document_malformed", f"{field} must list 1-{MAX_CAS_PER_KIND} certificates")
    certs = []
    for pem in value:
        try:
            cert = x509.load_pem_x509_certificate(str(pem).encode())
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except (ValueError, x509.ExtensionNotFound):
            raise DocumentError("document_malformed", f"{field} holds something that is not a CA") from None
        if not is_ca:
            raise DocumentError("document_malformed", f"{field} holds a certificate that is not a CA")
        certs.append(cert)
    return certs


def _ids(bundle: Path) -> set[str]:
    try:
        return {pki.ca_id(c) for c in x509.load_pem_x509_certificates(bundle.read_bytes())}
    except (OSError, ValueError):
        return set()
