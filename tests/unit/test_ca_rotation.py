"""CA rotation, fed values directly: the CA store, cross certificates, and what a collector accepts."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from collector.renewal import REISSUE_SPREAD_S, reissue_due
from collector.state import StatePaths
from collector.trust import TrustStore
from common.errors import ConfigError, FailedPrecondition
from common.trust import pki, signed_doc
from common.trust.ca_store import CaStore
from common.trust.keys import KeyPurpose, KeySet, trusted
from common.trust.signed_doc import DocumentError
from common.trust.trust_bundle import BundleSource
from enrollment.ca import CollectorCA, validate_csr
from router.trust import collector_docs
from tests.support.pki import csr_pem, p256

NOW = 1_800_000_000
KEYS = KeySet.create(KeyPurpose.DISPATCH, NOW - 60)
OTHER = KeySet.create(KeyPurpose.DISPATCH, NOW - 60)
TRUSTED = trusted(KEYS.public_keys(NOW))
AT = dt.datetime.fromtimestamp(NOW, dt.UTC)


def _code(call: Any) -> str | None:
    with pytest.raises((DocumentError, FailedPrecondition)) as refused:
        call()
    error = refused.value
    assert isinstance(error, DocumentError | FailedPrecondition)
    return error.code


def _ids(pem: str) -> set[str]:
    return {pki.ca_id(c) for c in x509.load_pem_x509_certificates(pem.encode())}


def test_first_use_adopts_the_cas_of_earlier_releases_and_removes_their_copies(tmp_path: Path) -> None:
    legacy, key = pki.self_signed_ca("Versus Collector CA", dt.timedelta(days=10), AT)
    (tmp_path / "collector-ca").mkdir()
    (tmp_path / "collector-ca" / "ca.pem").write_bytes(pki.cert_pem(legacy))
    (tmp_path / "collector-ca" / "ca.key").write_bytes(pki.private_pem(key))
    trust = CaStore(tmp_path).load_or_create(AT)
    assert trust.version == 1
    assert trust.active["collector"] == pki.ca_id(legacy)
    assert not (tmp_path / "collector-ca" / "ca.key").exists()
    # A new gateway CA was made (there was none to adopt); both are in the bundle.
    assert _ids(trust.bundle_pem()) == {pki.ca_id(legacy), trust.active["gateway"]}


def test_rotate_activate_retire_each_make_a_new_version(tmp_path: Path) -> None:
    store = CaStore(tmp_path)
    old = store.load_or_create(AT).active["collector"]
    trust = store.rotate("collector", AT)
    [new] = [e.ca_id for e in trust.cas["collector"] if e.ca_id != old]
    assert (trust.version, trust.active["collector"], trust.entry("collector", new).added_in) == (2, old, 2)  # type: ignore[union-attr]
    assert _code(lambda: store.retire("collector", old)) == "ca_is_active"
    assert _code(lambda: store.activate("collector", "ca-0000000000000000")) == "ca_not_found"
    assert store.activate("collector", new).version == 3
    assert store.activate("collector", new).version == 3  # already active: nothing changes
    trust = store.retire("collector", old)
    assert (trust.version, [e.ca_id for e in trust.cas["collector"]]) == (4, [new])
    assert not list((tmp_path / "ca" / "collector").glob(f"{old}.*"))
    assert _code(lambda: store.retire("collector", old)) == "ca_not_found"


def test_a_swapped_ca_certificate_is_refused_at_load(tmp_path: Path) -> None:
    store = CaStore(tmp_path)
    active = store.load_or_create(AT).active["gateway"]
    impostor, _ = pki.self_signed_ca("Versus Gateway TLS CA", dt.timedelta(days=10), AT)
    (tmp_path / "ca" / "gateway" / f"{active}.pem").write_bytes(pki.cert_pem(impostor))
    with pytest.raises(ConfigError, match="does not match its certificate"):
        store.load()


def test_a_pin_of_the_old_gateway_ca_reaches_the_new_one_only_through_its_cross_certificate(
    tmp_path: Path,
) -> None:
    store = CaStore(tmp_path)
    store.load_or_create(AT)
    trust = store.rotate("gateway", AT)
    old, new = trust.cas["gateway"]
    assert new.cross is not None
    assert pki.successors([old.cert], [new.cert], [new.cross]) == [old.cert, new.cert]
    # Pinning the new CA does not make the old one trusted: cross certificates only point forward.
    assert pki.successors([new.cert], [old.cert], [new.cross]) == [new.cert]
    # A "cross certificate" signed by anyone else proves nothing.
    stranger, stranger_key = pki.self_signed_ca("someone", dt.timedelta(days=10), AT)
    forged = pki.cross_sign(new.cert, stranger, stranger_key)
    assert pki.successors([old.cert], [new.cert], [forged]) == [old.cert]


def _enrolled(tmp_path: Path) -> tuple[TrustStore, BundleSource]:
    source = BundleSource(CaStore(tmp_path / "cp"), check_interval_s=0)
    bundle = source.get()
    active = source.store.load().active_entry("collector")
    ca = CollectorCA(active.cert, source.store.private_key("collector", active.ca_id))
    leaf = ca.issue(validate_csr(csr_pem(p256(), "c1")), site_id="s1", trust_domain="t", now=AT)
    paths = StatePaths(tmp_path / "collector")
    paths.root.mkdir()
    chain = pki.cert_pem(leaf).decode()
    (paths.root / "cert.pem").write_text(chain)
    TrustStore.write_enrolled(paths, bundle.version, bundle.pem(), chain)
    return TrustStore(paths, "c1", TRUSTED), source


def _document(source: BundleSource, now: int = NOW, keys: KeySet = KEYS, **change: Any) -> dict[str, str]:
    payload = {**collector_docs.trust_payload("c1", source.get(), now), **change}
    return signed_doc.sign(keys.current, payload)


def test_a_collector_takes_a_newer_signed_bundle_and_learns_what_changed(
    tmp_path: Path,
) -> None:
    held, source = _enrolled(tmp_path)
    old = source.get().collector_active
    assert (held.version, held.collector_active) == (1, old)
    trust = source.store.rotate("gateway")
    [added] = [e.ca_id for e in trust.cas["gateway"] if e.ca_id != trust.active["gateway"]]
    change = held.accept(_document(source), NOW)
    assert (change.version, change.added, change.removed) == (2, frozenset({added}), frozenset())
    assert added in _ids(held.paths.ca_bundle.read_text())
    assert _ids(held.pem_of(frozenset({added}))) == {added}
    retired = trust.active["gateway"]
    source.store.activate("gateway", added)
    source.store.retire("gateway", retired)
    change = held.accept(_document(source), NOW)
    assert (change.version, change.removed) == (4, frozenset({retired}))
    # Held across a restart.
    assert TrustStore(held.paths, "c1", TRUSTED).version == 4


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"keys": OTHER}, "unknown_kid"),
        ({"now": NOW - collector_docs.CONFIG_LIFETIME_S - 1}, "expired"),
        ({"collector_id": "c2"}, "wrong_collector"),
        ({"type": "collector_config"}, "wrong_type"),
        ({"version": 1}, "trust_version_not_newer"),
        ({"collector_cas": []}, "document_malformed"),
        ({"gateway_cas": ["not a certificate"]}, "document_malformed"),
        ({"gateway_cas": ["x"] * 5}, "document_malformed"),
        ({"collector_active": 7}, "document_malformed"),
    ],
)
def test_a_bundle_that_is_not_signed_newer_and_well_formed_is_refused_and_nothing_changes(
    tmp_path: Path, change: dict[str, Any], code: str
) -> None:
    held, source = _enrolled(tmp_path)
    source.store.rotate("gateway")
    before = held.paths.ca_bundle.read_bytes()
    assert _code(lambda: held.accept(_document(source, **change), NOW)) == code
    assert held.paths.ca_bundle.read_bytes() == before
    assert held.version == 1


def test_a_certificate_that_is_not_a_ca_cannot_join_the_bundle(tmp_path: Path) -> None:
    held, source = _enrolled(tmp_path)
    source.store.rotate("gateway")
    leaf_pem = (held.paths.root / "cert.pem").read_text()  # a collector certificate: CA false
    before = held.paths.ca_bundle.read_bytes()
    assert _code(lambda: held.accept(_document(source, gateway_cas=[leaf_pem]), NOW)) == "document_malformed"
    assert held.version == 1 and held.paths.ca_bundle.read_bytes() == before


def test_a_certificate_of_a_retired_issuer_is_renewed_soon_and_spread(tmp_path: Path) -> None:
    rng = random.Random(7)
    life = 90 * 86400.0
    dues = [reissue_due(NOW, NOW - 86400, NOW - 86400 + life, rng) - NOW for _ in range(200)]
    assert min(dues) >= 0 and max(dues) <= REISSUE_SPREAD_S
    assert max(dues) - min(dues) > REISSUE_SPREAD_S / 2  # spread, not all at once
    # A short-lived certificate (tests run them in seconds) is reissued within 5 % of its life.
    assert max(reissue_due(NOW, NOW, NOW + 60, rng) - NOW for _ in range(50)) <= 3.0


def test_a_short_lived_leaf_is_usable_for_its_whole_lifetime_from_issue(tmp_path: Path) -> None:
    """The backdate opens the window early; it is not taken out of the lifetime (a 60 s leaf
    would otherwise be issued already expired, as a 4-minute-short leaf once was in e2e)."""
    store = CaStore(tmp_path / "cp")
    BundleSource(store, check_interval_s=0).get()
    active = store.load().active_entry("collector")
    ca = CollectorCA(active.cert, store.private_key("collector", active.ca_id))
    lifetime = dt.timedelta(seconds=60)
    leaf = ca.issue(
        validate_csr(csr_pem(p256(), "c1")), site_id="s1", trust_domain="t", now=AT, lifetime=lifetime
    )
    assert leaf.not_valid_after_utc == AT + lifetime
    assert leaf.not_valid_before_utc < AT
