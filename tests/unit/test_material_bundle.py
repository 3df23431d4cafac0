"""The shared key material's bundle: sealed, it is bound to its row and version; its public part
holds no secret."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from common.material import bundle as material_bundle
from common.material.bundle import PRIVATE_MODE, PUBLIC_MODE, Bundle
from common.trust.master_keys import MasterKeys

pytestmark = pytest.mark.timeout(10)

FILES = {
    "keys/dispatch/keyset.json": (PUBLIC_MODE, b'{"version": 3, "keys": [{"kid": "k1"}, {"kid": "k2"}]}'),
    "keys/dispatch/k2.pem": (PRIVATE_MODE, b"PRIVATE k2"),
    "keys/dispatch/chain/2.json": (PUBLIC_MODE, b"{}"),
    "ca/trust.json": (
        PUBLIC_MODE,
        b'{"version": 2, "collector": {"cas": [{"id": "c1"}]}, "gateway": {"cas": []}}',
    ),
    "ca/collector/c1.key": (PRIVATE_MODE, b"PRIVATE c1"),
    "credentials-master-keys.json": (PRIVATE_MODE, b"{}"),
}


def test_a_sealed_bundle_opens_to_the_same_files() -> None:
    keys = MasterKeys.generate()
    bundle = Bundle("mat-1", FILES)
    kid, sealed = material_bundle.seal(keys, "row", 4, bundle)
    assert kid == keys.active
    assert b"PRIVATE" not in sealed
    opened = material_bundle.unseal(keys, "row", 4, kid, sealed)
    assert opened.material_id == "mat-1" and dict(opened.files) == FILES


def test_a_sealed_bundle_replayed_as_another_version_or_row_does_not_open() -> None:
    keys = MasterKeys.generate()
    kid, sealed = material_bundle.seal(keys, "row", 4, Bundle("mat-1", FILES))
    with pytest.raises(ConfigError, match="does not open"):
        material_bundle.unseal(keys, "row", 5, kid, sealed)
    with pytest.raises(ConfigError, match="does not open"):
        material_bundle.unseal(keys, "other", 4, kid, sealed)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(ConfigError, match="does not open"):
        material_bundle.unseal(keys, "row", 4, kid, tampered)


def test_a_key_file_without_the_sealing_key_names_what_it_holds() -> None:
    kid, sealed = material_bundle.seal(MasterKeys.generate(), "row", 1, Bundle("mat-1", FILES))
    other = MasterKeys.generate()
    with pytest.raises(ConfigError, match=f"sealed with material key '{kid}'.*holds {other.active}"):
        material_bundle.unseal(other, "row", 1, kid, sealed)


def test_the_public_part_holds_no_private_file() -> None:
    public = material_bundle.public_part(Bundle("mat-1", FILES))
    assert sorted(public.files) == [
        "ca/trust.json",
        "keys/dispatch/chain/2.json",
        "keys/dispatch/keyset.json",
    ]
    assert b"PRIVATE" not in material_bundle.encode(public)


def test_index_files_are_written_last() -> None:
    order = material_bundle.write_order(list(FILES))
    assert order[-2:] == ["ca/trust.json", "keys/dispatch/keyset.json"]


def test_a_bundle_naming_a_path_outside_the_material_is_refused() -> None:
    for path in ("../etc/passwd", "keys/../../x", "/etc/shadow", "admin-token", "keys/.lock"):
        raw = material_bundle.encode(Bundle("m", {path: (PUBLIC_MODE, b"x")}))
        with pytest.raises(ConfigError, match="outside the material"):
            material_bundle.decode(raw)


def test_the_summary_names_key_ids_and_ca_ids() -> None:
    summary = Bundle("mat-1", FILES).summary()
    assert summary["dispatch"] == {"version": 3, "kids": ["k1", "k2"]}
    assert summary["collector_cas"] == ["c1"] and summary["ca_version"] == 2


def test_repr_never_shows_file_contents_or_keys() -> None:
    keys = MasterKeys.generate()
    assert "PRIVATE" not in repr(Bundle("m", FILES))
    assert repr(keys) == f"MasterKeys(active={keys.active!r}, kids={[keys.active]!r})"
