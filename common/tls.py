"""Gateway TLS material: an internal CA and a server certificate generated on first start.

Used when no ``VERSUS_TLS_CERT_FILE``/``VERSUS_TLS_KEY_FILE`` is configured. The
CA here signs only the gateway's server certificate; it is not the Collector
CA that issues collector identities. Collectors receive this CA in the
enrollment trust bootstrap and pin it by its SPKI SHA-256.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.pki import BACKDATE, cert_pem, private_pem, self_signed_ca
from common.state_dir import write_private, write_public

CA_LIFETIME = dt.timedelta(days=3650)
SERVER_LIFETIME = dt.timedelta(days=397)
# Renew the server certificate when less than this remains.
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class GatewayTls:
    cert_file: Path
    key_file: Path
    ca_file: Path | None

    def ca_pin(self) -> str | None:
        """``sha256/<base64>`` of the CA's SubjectPublicKeyInfo, as collectors pin it."""
        if self.ca_file is None:
            return None
        return spki_pin(x509.load_pem_x509_certificate(self.ca_file.read_bytes()))


def spki_pin(cert: x509.Certificate) -> str:
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256/" + base64.b64encode(hashlib.sha256(spki).digest()).decode()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _ensure_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / "gateway-ca.pem", directory / "gateway-ca.key"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key
    cert, key = self_signed_ca("Versus Gateway TLS CA", CA_LIFETIME, _now())
    write_private(key_path, private_pem(key))
    write_public(cert_path, cert_pem(cert))
    return cert, key


def _san_entries(names: list[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(n for n in names if n and n not in {"0.0.0.0", "::"}):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name.strip("[]"))))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def _server_current(path: Path, ca: x509.Certificate, sans: list[x509.GeneralName]) -> bool:
    if not path.exists():
        return False
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    if cert.issuer != ca.subject or cert.not_valid_after_utc - _now() < RENEW_BEFORE:
        return False
    have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(sans) <= set(have)


def ensure_gateway_tls(directory: Path, server_name: str, extra_names: list[str]) -> GatewayTls:
    """Create (or renew) the CA and a server certificate for ``server_name`` and ``extra_names``."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_cert, ca_key = _ensure_ca(directory)
    cert_path, key_path = directory / "gateway.pem", directory / "gateway.key"
    sans = _san_entries([server_name, "localhost", "127.0.0.1", "::1", *extra_names])
    if not (_server_current(cert_path, ca_cert, sans) and key_path.exists()):
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + SERVER_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        write_private(key_path, private_pem(key))
        chain = cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(
            serialization.Encoding.PEM
        )
        write_public(cert_path, chain)
    return GatewayTls(cert_file=cert_path, key_file=key_path, ca_file=directory / "gateway-ca.pem")
