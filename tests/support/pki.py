"""Keys and CSRs for enrollment tests."""

from __future__ import annotations

import warnings

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import NameOID


def p256() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def csr_pem(
    key: CertificateIssuerPrivateKeyTypes,
    cn: str | None,
    *,
    ask_for_ca: bool = False,
) -> str:
    # Without the library's own length check (and its warning): openssl writes a 65-128 character CN.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        names = [x509.NameAttribute(NameOID.COMMON_NAME, cn, _validate=False)] if cn is not None else []
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(names))
    if ask_for_ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def p384() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def tamper_signature(pem: str) -> str:
    """The same CSR with its signature bits altered (still parses)."""
    der = bytearray(x509.load_pem_x509_csr(pem.encode()).public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0x01
    return x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM).decode()
