"""The Collector CA: issues collector identity certificates and nothing else.

It is separate from the gateway's TLS CA. The CA decides every extension of a
leaf: whatever the CSR asks for (CA:true, other SANs, key usages) is ignored;
only its public key and Common Name are used, after the CSR's self-signature
proves possession of the key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.config.state_dir import write_private, write_public
from common.errors import ConfigError, InvalidArgument
from common.trust import pki
from common.trust.pki import BACKDATE, key_usage, private_pem, self_signed_ca

LEAF_LIFETIME = dt.timedelta(days=90)
CA_LIFETIME = dt.timedelta(days=3650)
# Collector ids appear in URIs, envelopes and logs: keep them to a safe alphabet.
# X.509 caps a Common Name at 64 characters (RFC 5280 ub-common-name), and the collector id is the CN.
MAX_COLLECTOR_ID_CHARS = 64
COLLECTOR_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_COLLECTOR_ID_CHARS - 1}}}")
MAX_CSR_PEM_CHARS = 16 * 1024


@dataclass(frozen=True, slots=True)
class CsrInfo:
    """What the CA takes from a validated CSR."""

    collector_id: str
    public_key: ec.EllipticCurvePublicKey
    public_key_der: bytes
    public_key_sha256: bytes


def validate_csr(csr_pem: str) -> CsrInfo:
    """Parse a CSR and check, in order: it parses, its self-signature verifies, the key is
    EC P-256 (it will sign ES256 bearer tokens), the CN is present and a valid collector id."""
    if not csr_pem or len(csr_pem) > MAX_CSR_PEM_CHARS:
        raise InvalidArgument("csr_pem is missing or too large", code="csr_invalid")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise InvalidArgument(
            "csr_pem is not a PEM certificate signing request", code="csr_invalid"
        ) from None
    try:
        signature_ok = csr.is_signature_valid
    except Exception:  # cryptography raises various types for unsupported algorithms
        signature_ok = False
    if not signature_ok:
        raise InvalidArgument("the CSR signature does not verify", code="csr_signature_invalid")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise InvalidArgument(
            "the key must be EC P-256 (it signs ES256 bearer tokens)", code="csr_key_unsupported"
        )
    with warnings.catch_warnings():
        # cryptography warns about a CN over X.509's 64 characters while parsing; the rule below refuses it.
        warnings.simplefilter("ignore", UserWarning)
        names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(names[0].value).strip() if names else ""
    if not cn:
        raise InvalidArgument("the CSR has no Common Name (the collector id)", code="csr_cn_missing")
    if not COLLECTOR_ID.fullmatch(cn):
        raise InvalidArgument(
            f"the Common Name must be 1-{MAX_COLLECTOR_ID_CHARS} characters of letters, digits, '.', '_' "
            "or '-' (starting with a letter or digit)",
            code="csr_cn_invalid",
        )
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return CsrInfo(cn, key, der, hashlib.sha256(der).digest())


def spiffe_id(trust_domain: str, site_id: str, collector_id: str) -> str:
    return f"spiffe://{trust_domain}/site/{site_id}/collector/{collector_id}"


class CollectorCA:
    """The CA certificate and key. ``repr`` never shows the key."""

    __slots__ = ("_key", "cert")

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey):
        self.cert = cert
        self._key = key

    def __repr__(self) -> str:
        return f"CollectorCA(subject={self.cert.subject.rfc4514_string()!r}, key=[REDACTED])"

    @classmethod
    def load_or_create(cls, directory: Path) -> CollectorCA:
        """The CA under ``directory`` (``ca.pem``, ``ca.key`` 0600), created on first use."""
        cert_path, key_path = directory / "ca.pem", directory / "ca.key"
        if cert_path.exists() and key_path.exists():
            return cls.from_files(cert_path, key_path)
        cert, key = self_signed_ca("Versus Collector CA", CA_LIFETIME, dt.datetime.now(dt.UTC))
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(key_path, private_pem(key))
        write_public(cert_path, pki.cert_pem(cert))
        return cls(cert, key)

    @classmethod
    def from_files(cls, cert_path: Path, key_path: Path) -> CollectorCA:
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the Collector CA from {cert_path}: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError("the Collector CA key must be an EC key")
        if cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            raise ConfigError("the Collector CA certificate and key do not match")
        return cls(cert, key)

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

    def issue(
        self,
        csr: CsrInfo,
        *,
        site_id: str,
        trust_domain: str,
        now: dt.datetime,
        lifetime: dt.timedelta = LEAF_LIFETIME,
    ) -> x509.Certificate:
        """A client certificate binding ``csr.collector_id`` to ``site_id``, valid for ``lifetime`` from
        ``now`` and from a few minutes before, for clocks that run behind (notAfter - notBefore is
        ``lifetime`` + BACKDATE; taking the backdate out of the lifetime would issue a short-lived
        certificate already expired)."""
        not_before = now - BACKDATE
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, csr.collector_id)]))
            .issuer_name(self.cert.subject)
            .public_key(csr.public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(key_usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier(spiffe_id(trust_domain, site_id, csr.collector_id))]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(csr.public_key), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
