"""Gateway TLS material: a server certificate issued by the active gateway CA, generated on first start.

Used when no ``VERSUS_TLS_CERT_FILE``/``VERSUS_TLS_KEY_FILE`` is configured. The
gateway CA (common/trust/ca_store.py) signs only the gateway's server certificate; it
is not the Collector CA that issues collector identities. Collectors receive it
in the enrollment trust bootstrap (checked against the enroll command's SPKI
pin) and later versions in-band; a rotation reissues the server certificate
under the new CA once an operator activates it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.config.settings import Settings
from common.config.state_dir import ensure_writable, write_private, write_public
from common.errors import ConfigError
from common.trust import pki
from common.trust.ca_store import CaStore
from common.trust.pki import BACKDATE, cert_pem, private_pem, spki_pin

SERVER_LIFETIME = dt.timedelta(days=397)
# Renew the server certificate when less than this remains.
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class GatewayTls:
    cert_file: Path
    key_file: Path
    # Every gateway CA collectors may meet (a rotation has two), PEM; None for supplied certificates.
    ca_file: Path | None
    # ``sha256/<base64>`` of the CA that issued the server certificate, as collectors pin it.
    pin: str | None = None

    def ca_pin(self) -> str | None:
        return self.pin


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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
    if pki.issuer_id(cert) != pki.ca_id(ca) or cert.not_valid_after_utc - _now() < RENEW_BEFORE:
        return False
    have = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(sans) <= set(have)


def issue_server_cert(store: CaStore, server_name: str, sans: list[x509.GeneralName]) -> tuple[bytes, bytes]:
    """A new key and a server certificate for it from the store's active gateway CA:
    (certificate followed by the CA, PEM; private key, PEM)."""
    active = store.load_or_create().active_entry("gateway")
    ca_cert = active.cert
    ca_key = store.private_key("gateway", active.ca_id)
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
    return cert_pem(cert) + cert_pem(ca_cert), private_pem(key)


def san_entries(names: list[str]) -> list[x509.GeneralName]:
    """Subject alternative names for host names and IP addresses (wildcard binds left out)."""
    return _san_entries(names)


def ensure_gateway_tls(
    directory: Path, server_name: str, extra_names: list[str], store: CaStore | None = None
) -> GatewayTls:
    """A server certificate for ``server_name`` and ``extra_names`` issued by the active gateway CA
    of ``store`` (default: one under ``directory``), reissued when that CA changed, the names
    changed or it nears expiry; and ``gateway-ca.pem``, every gateway CA of the store."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = store or CaStore(directory)
    trust = store.load_or_create()
    active = trust.active_entry("gateway")
    ca_cert = active.cert
    cert_path, key_path = directory / "gateway.pem", directory / "gateway.key"
    sans = _san_entries([server_name, "localhost", "127.0.0.1", "::1", *extra_names])
    if not (_server_current(cert_path, ca_cert, sans) and key_path.exists()):
        chain, key_pem = issue_server_cert(store, server_name, sans)
        # The key first: a reader that sees the new certificate finds its key (gateway/tls_reload.py).
        write_private(key_path, key_pem)
        write_public(cert_path, chain)
    ca_path = directory / "gateway-ca.pem"
    bundle = "".join(trust.pems("gateway")).encode()
    if not ca_path.exists() or ca_path.read_bytes() != bundle:
        write_public(ca_path, bundle)
    return GatewayTls(cert_file=cert_path, key_file=key_path, ca_file=ca_path, pin=spki_pin(ca_cert))


def resolve_tls(settings: Settings, store: CaStore | None = None) -> GatewayTls | None:
    """Configured certificate files, or ones generated under the state directory."""
    if not settings.gateway_tls:
        return None
    cert, key = settings.tls_cert_file, settings.tls_key_file
    if (cert is None) != (key is None):
        raise ConfigError("VERSUS_TLS_CERT_FILE and VERSUS_TLS_KEY_FILE must be set together")
    if cert is not None and key is not None:
        for path in (cert, key):
            if not path.is_file():
                raise ConfigError(f"TLS file {path} does not exist")
        return GatewayTls(cert_file=cert, key_file=key, ca_file=None)
    state = ensure_writable(settings.state_dir)
    return ensure_gateway_tls(
        state / "tls", settings.gateway_server_name, [settings.gateway_host], store or CaStore(state)
    )
