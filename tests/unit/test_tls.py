from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from common.trust import pki
from common.trust.ca_store import CaStore
from common.trust.pki import spki_pin
from common.trust.tls import ensure_gateway_tls


def _leaf(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates(path.read_bytes())[0]


def test_generates_ca_and_server_certificate(tmp_path: Path) -> None:
    tls = ensure_gateway_tls(tmp_path / "tls", "gw.example.net", ["10.0.0.5"])
    assert tls.ca_file is not None
    chain = x509.load_pem_x509_certificates(tls.cert_file.read_bytes())
    leaf, ca = chain[0], chain[1]
    ca.verify_directly_issued_by(ca)
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gw.example.net" in sans.get_values_for_type(x509.DNSName)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} >= {"10.0.0.5", "127.0.0.1", "::1"}
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert (
        ExtendedKeyUsageOID.SERVER_AUTH
        in leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    ca_keys = list((tmp_path / "tls" / "ca" / "gateway").glob("*.key"))
    assert len(ca_keys) == 1
    for key in (tls.key_file, *ca_keys):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_second_call_reuses_material(tmp_path: Path) -> None:
    first = ensure_gateway_tls(tmp_path, "gw", [])
    before = first.cert_file.read_bytes()
    second = ensure_gateway_tls(tmp_path, "gw", [])
    assert second.cert_file.read_bytes() == before
    assert first.ca_pin() == second.ca_pin()


def test_new_name_reissues_leaf_under_same_ca(tmp_path: Path) -> None:
    first = ensure_gateway_tls(tmp_path, "gw", [])
    pin = first.ca_pin()
    second = ensure_gateway_tls(tmp_path, "gw", ["192.0.2.7"])
    assert second.ca_pin() == pin
    sans = _leaf(second.cert_file).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "192.0.2.7" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}


def test_pin_is_sha256_of_spki(tmp_path: Path) -> None:
    tls = ensure_gateway_tls(tmp_path, "gw", [])
    assert tls.ca_file is not None
    ca = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
    pin = tls.ca_pin()
    assert pin == spki_pin(ca)
    assert pin is not None and pin.startswith("sha256/") and len(pin) == len("sha256/") + 44


def test_activating_a_new_gateway_ca_reissues_the_server_certificate_under_it(tmp_path: Path) -> None:
    store = CaStore(tmp_path)
    first = ensure_gateway_tls(tmp_path / "tls", "gw", [], store)
    old = store.load().active["gateway"]
    trust = store.rotate("gateway")
    [new] = [e.ca_id for e in trust.cas["gateway"] if e.ca_id != old]
    # Added beside the old one: still served by the old CA, and gateway-ca.pem names both.
    rotated = ensure_gateway_tls(tmp_path / "tls", "gw", [], store)
    assert pki.issuer_id(_leaf(rotated.cert_file)) == old and rotated.ca_pin() == first.ca_pin()
    assert rotated.ca_file is not None
    assert {pki.ca_id(c) for c in x509.load_pem_x509_certificates(rotated.ca_file.read_bytes())} == {old, new}
    store.activate("gateway", new)
    switched = ensure_gateway_tls(tmp_path / "tls", "gw", [], store)
    assert pki.issuer_id(_leaf(switched.cert_file)) == new
    assert switched.ca_pin() != first.ca_pin()
    store.retire("gateway", old)
    retired = ensure_gateway_tls(tmp_path / "tls", "gw", [], store)
    assert retired.ca_file is not None
    assert [pki.ca_id(c) for c in x509.load_pem_x509_certificates(retired.ca_file.read_bytes())] == [new]
