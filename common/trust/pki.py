"""Small X.509 helpers shared by the gateway TLS material and the Collector CA."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import NameOID

# Certificates start a little in the past so a peer with a slow clock accepts them at once.
BACKDATE = dt.timedelta(minutes=5)


def key_usage(
    *, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    """A KeyUsage with only the named bits set."""
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def self_signed_ca(
    common_name: str,
    lifetime: dt.timedelta,
    now: dt.datetime,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new EC P-256 root that may sign leaves only (path length 0)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 PEM without encryption: the file's mode (0600) is the protection."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def ca_id(cert: x509.Certificate) -> str:
    """A CA's short id: ``ca-`` and the first 16 hex digits of its key identifier (the SHA-1 of
    its public key, RFC 5280 method 1), which is also what its leaves name as their issuer."""
    return key_ca_id(cert.public_key())


def key_ca_id(public_key: CertificatePublicKeyTypes) -> str:
    """:func:`ca_id` of a CA with ``public_key``."""
    return "ca-" + x509.SubjectKeyIdentifier.from_public_key(public_key).digest.hex()[:16]


def issuer_id(leaf: x509.Certificate) -> str:
    """The :func:`ca_id` of the CA that issued ``leaf`` ("" when the leaf names none)."""
    try:
        aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    except x509.ExtensionNotFound:
        return ""
    return "ca-" + aki.key_identifier.hex()[:16] if aki.key_identifier else ""


def cross_sign(
    subject: x509.Certificate, issuer: x509.Certificate, issuer_key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    """``subject``'s name and key certified by ``issuer``: whoever trusts ``issuer`` can check that
    ``subject`` is its successor (enrollment pins keep working across a rotation)."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject.subject)
        .issuer_name(issuer.subject)
        .public_key(subject.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(subject.not_valid_before_utc)
        .not_valid_after(min(subject.not_valid_after_utc, issuer.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(subject.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
        .sign(issuer_key, hashes.SHA256())
    )


def successors(trusted: list[x509.Certificate], candidates: list[x509.Certificate],
               cross: list[x509.Certificate]) -> list[x509.Certificate]:  # fmt: skip
    """``trusted`` plus every candidate CA reachable from it through cross certificates: a
    candidate is added when a cross certificate for its key verifies under a CA already trusted."""
    out = list(trusted)
    changed = True
    while changed:
        changed = False
        for candidate in candidates:
            if any(_same_key(candidate, t) for t in out):
                continue
            for link in cross:
                if _same_key(link, candidate) and any(_issued_by(link, t) for t in out):
                    out.append(candidate)
                    changed = True
                    break
    return out


def _same_key(a: x509.Certificate, b: x509.Certificate) -> bool:
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return a.public_key().public_bytes(*der) == b.public_key().public_bytes(*der)


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def spki_pin(cert: x509.Certificate) -> str:
    """``sha256/<base64>`` of the certificate's SubjectPublicKeyInfo, as enroll commands pin a CA."""
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256/" + base64.b64encode(hashlib.sha256(spki).digest()).decode()
