"""Vault mode B at rest: envelope encryption under the operator's master keys (docs/vault.md)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from common.errors import ConfigError, InvalidArgument
from router.credentials.store import parse_value
from router.credentials.vault import (
    CredentialUnreadable,
    MasterKeys,
    SealedCredential,
    open_value,
    rewrap,
    seal_value,
)

VALUE = {"username": "netops", "password": "hunter2-very-secret"}


def _keys(*kids: str, active: str | None = None) -> MasterKeys:
    return MasterKeys(active or kids[-1], {k: os.urandom(32) for k in kids})


def test_a_sealed_credential_opens_only_as_the_row_it_was_sealed_for() -> None:
    master = _keys("mk-1")
    sealed = seal_value(master, "acme", "ssh:sw-1", 3, VALUE)
    stored = sealed.wrapped_key + sealed.nonce + sealed.ciphertext
    assert b"hunter2" not in stored and b"netops" not in stored
    assert open_value(master, "acme", "ssh:sw-1", 3, sealed) == VALUE
    # Copied onto another tenant's row, another device's, or rolled back to another version.
    for tenant, ref, version in (("globex", "ssh:sw-1", 3), ("acme", "ssh:sw-2", 3), ("acme", "ssh:sw-1", 2)):
        with pytest.raises(CredentialUnreadable):
            open_value(master, tenant, ref, version, sealed)


def test_altered_rows_and_missing_master_keys_are_refused() -> None:
    master = _keys("mk-1")
    sealed = seal_value(master, "acme", "ssh:sw-1", 1, VALUE)
    flipped = bytearray(sealed.ciphertext)
    flipped[0] ^= 1
    for bad in (
        SealedCredential(sealed.key_id, sealed.wrapped_key, sealed.nonce, bytes(flipped)),
        # A bit flipped, never a byte replaced: the last byte was "x" one time in 256.
        SealedCredential(
            sealed.key_id,
            sealed.wrapped_key[:-1] + bytes([sealed.wrapped_key[-1] ^ 1]),
            sealed.nonce,
            sealed.ciphertext,
        ),
    ):
        with pytest.raises(CredentialUnreadable):
            open_value(master, "acme", "ssh:sw-1", 1, bad)
    with pytest.raises(CredentialUnreadable, match="not loaded"):
        open_value(_keys("mk-other"), "acme", "ssh:sw-1", 1, sealed)


def test_a_master_key_rotation_rewraps_data_keys_without_touching_values() -> None:
    old = _keys("mk-1")
    sealed = seal_value(old, "acme", "http:lb-1", 1, VALUE)
    both = MasterKeys("mk-2", {**old.keys, "mk-2": os.urandom(32)})
    assert open_value(both, "acme", "http:lb-1", 1, sealed) == VALUE  # old keys still unwrap
    moved = rewrap(both, sealed)
    assert moved.key_id == "mk-2" and moved.ciphertext == sealed.ciphertext
    only_new = MasterKeys("mk-2", {"mk-2": both.keys["mk-2"]})
    assert open_value(only_new, "acme", "http:lb-1", 1, moved) == VALUE
    assert "mk-1" in repr(both) and base64.b64encode(both.keys["mk-2"]).decode() not in repr(both)


def test_the_master_key_file_is_created_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "master.json"
    with pytest.raises(ConfigError, match="does not exist"):
        MasterKeys.load_or_create(path, create=False)
    created = MasterKeys.load_or_create(path, create=True)
    assert path.stat().st_mode & 0o777 == 0o600
    assert MasterKeys.load_or_create(path, create=False) == created
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        MasterKeys.load_or_create(path, create=False)
    for doc in (
        {"active": "x", "keys": {}},
        {"active": "a", "keys": {"a": base64.b64encode(b"short").decode()}},
    ):
        with pytest.raises(ConfigError):
            MasterKeys.parse(json.dumps(doc).encode(), "test")


def test_credential_values_are_json_objects_of_bounded_size() -> None:
    assert parse_value(json.dumps(VALUE).encode()) == VALUE
    for bad in (b"[]", b"{}", b"not json", b'{"x": "' + b"y" * 20_000 + b'"}'):
        with pytest.raises(InvalidArgument) as refused:
            parse_value(bad)
        assert refused.value.code == "credential_value_invalid"
