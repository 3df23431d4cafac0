from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from common.envelope.sign import EnvelopeDraft, sign
from common.envelope.verify import VerifyContext, verify
from common.errors import ConfigError
from common.trust.keys import KeyPurpose, KeySet, PublicKey, SigningKey, parse_rfc3339, rfc3339, trusted
from common.trust.keystore import KeyStore, ReloadingKeySet

NOW = 1_767_225_600
DAY = 86_400


class _NoJournal:
    def lookup(self, idempotency_key: str) -> None:
        return None


def _draft() -> EnvelopeDraft:
    return EnvelopeDraft("t", "col", "p", "o", "read", "dev", "idem", b"x", NOW - 10, NOW + 60)


def test_private_material_never_in_repr(tmp_path: Path) -> None:
    key = SigningKey.from_seed("dsp-x", b"\x07" * 32, NOW + DAY)
    seed_hex = key.private_key().private_bytes_raw().hex()
    assert "REDACTED" in repr(key)
    assert seed_hex not in repr(key)
    keyset = KeySet(KeyPurpose.DISPATCH, (key,), "dsp-x")
    assert seed_hex not in repr(keyset)


def test_rotation_keeps_old_keys_verifying_until_not_after() -> None:
    keyset = KeySet.create(KeyPurpose.DISPATCH, NOW)
    old = keyset.current
    envelope = sign(_draft(), old)
    rotated = keyset.rotate(NOW + DAY)
    assert rotated.current.kid != old.kid
    assert rotated.public_keys(NOW + DAY)[0].kid == rotated.current.kid
    ctx = VerifyContext("col", NOW, trusted(rotated.public_keys(NOW)), set(), _NoJournal())
    assert verify(envelope, ctx).envelope.fields.kid == old.kid
    # Once the old key is past not_after it is neither published nor kept on the next rotation.
    after = old.not_after + 1
    assert old.kid not in {k.kid for k in rotated.public_keys(after)}
    assert old.kid not in {k.kid for k in rotated.rotate(after).keys}


def test_dispatch_and_release_sets_are_distinct() -> None:
    dispatch = KeySet.create(KeyPurpose.DISPATCH, NOW)
    release = KeySet.create(KeyPurpose.RELEASE, NOW)
    assert dispatch.current.kid.startswith("dsp-")
    assert release.current.kid.startswith("rel-")
    envelope = sign(_draft(), release.current)
    ctx = VerifyContext("col", NOW, trusted(dispatch.public_keys(NOW)), set(), _NoJournal())
    with pytest.raises(Exception, match="unknown_kid"):
        verify(envelope, ctx)


def test_public_key_json_round_trip() -> None:
    key = SigningKey.from_seed("dsp-j", b"\x01" * 32, NOW)
    obj = key.public.to_json()
    assert obj == {"kid": "dsp-j", "alg": "ed25519", "pub": obj["pub"], "not_after": "2026-01-01T00:00:00Z"}
    assert PublicKey.from_json(obj) == key.public
    assert parse_rfc3339(rfc3339(NOW)) == NOW
    with pytest.raises(ValueError, match="unsupported key algorithm"):
        PublicKey(kid="x", public=key.public.public, not_after=NOW, alg="rsa")


def test_store_persists_with_private_files_0600(tmp_path: Path) -> None:
    store = KeyStore(tmp_path, KeyPurpose.DISPATCH)
    created = store.load_or_create(NOW)
    loaded = KeyStore(tmp_path, KeyPurpose.DISPATCH).load()
    assert loaded.current_kid == created.current_kid
    assert loaded.current.public == created.current.public
    pem = store.directory / f"{created.current_kid}.pem"
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    index = json.loads(store.index.read_text())
    assert "PRIVATE" not in store.index.read_text()
    assert index["current"] == created.current_kid


def test_store_rotation_and_pruning(tmp_path: Path) -> None:
    store = KeyStore(tmp_path, KeyPurpose.RELEASE)
    first = store.load_or_create(NOW)
    import datetime as dt

    second = store.rotate(NOW + DAY, dt.timedelta(days=2))
    assert {k.kid for k in second.keys} == {first.current_kid, second.current_kid}
    assert store.load().current_kid == second.current_kid
    # Rotating after the first key expired drops it and its private file.
    third = store.rotate(first.current.not_after + 1)
    assert first.current_kid not in {k.kid for k in third.keys}
    assert not (store.directory / f"{first.current_kid}.pem").exists()


def test_corrupt_store_is_a_config_error(tmp_path: Path) -> None:
    store = KeyStore(tmp_path, KeyPurpose.DISPATCH)
    keyset = store.load_or_create(NOW)
    (store.directory / f"{keyset.current_kid}.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="cannot load dispatch keys"):
        store.load()


def test_reloading_keyset_sees_rotation(tmp_path: Path) -> None:
    store = KeyStore(tmp_path, KeyPurpose.DISPATCH)
    live = ReloadingKeySet(store, check_interval_s=0)
    before = live.get().current_kid
    import os

    rotated = store.rotate()
    # Make the change visible even on filesystems with coarse timestamps.
    os.utime(store.index, ns=(store.mtime_ns() + 1_000_000_000,) * 2)
    assert live.get().current_kid == rotated.current_kid != before


def test_signing_key_for_what_the_verifier_holds() -> None:
    now = 1_800_000_000
    first = KeySet.create(KeyPurpose.DISPATCH, now)
    second = first.rotate(now + 10)
    third = second.rotate(now + 20)
    old, middle, newest = (first.current_kid, second.current_kid, third.current_kid)

    def kid(held: set[str] | None) -> str | None:
        key = third.signing_key_for(held, now)
        return key.kid if key is not None else None

    assert kid(None) == newest  # unknown holdings: the current key
    assert kid({old, middle, newest}) == newest
    assert kid({old, middle}) == middle  # the newest it holds
    assert kid({old}) == old
    assert third.signing_key_for({"dsp-elsewhere"}, now) is None
    assert third.signing_key_for(set(), now) is None
    # An expired key is never used, even when it is the only one held.
    later = third.keys[0].not_after + 1
    assert third.signing_key_for({old}, later) is None
