"""Vault mode A: credentials sealed under the collector's identity key (docs/vault.md)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from collector import enroll
from collector.credentials import FILE_NAME, PLAIN_NAME, LocalCredentials, read_sealed, write_sealed
from collector.main import main
from collector.sealed import SealedError, seal, unseal
from collector.state import StatePaths, load_key, save_key
from common.config.state_dir import write_private
from common.trust import b64url

SECRET = "hunter2-very-secret"
CREDS = {"ssh": {"sw-1": {"username": "netops", "password": SECRET}}}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def test_sealed_credentials_open_with_the_identity_and_hold_no_plaintext() -> None:
    key = _key()
    sealed = seal(key, CREDS)
    assert SECRET.encode() not in sealed and b"netops" not in sealed and b"sw-1" not in sealed
    assert unseal(key, sealed) == CREDS
    assert seal(key, CREDS) != sealed  # a fresh nonce every time


def test_a_stolen_file_without_the_identity_key_is_useless() -> None:
    sealed = seal(_key(), CREDS)
    with pytest.raises(SealedError) as refused:
        unseal(_key(), sealed)
    assert refused.value.code == "credentials_tampered"


@pytest.mark.parametrize("damage", ["flip", "truncate", "nonce", "format", "version", "garbage"])
def test_a_tampered_file_is_refused_with_a_stable_code(damage: str) -> None:
    key = _key()
    doc = json.loads(seal(key, CREDS))
    if damage == "flip":
        raw = bytearray(b64url.decode(doc["ciphertext"]))
        raw[3] ^= 1
        doc["ciphertext"] = b64url.encode(bytes(raw))
    elif damage == "truncate":
        doc["ciphertext"] = doc["ciphertext"][:-4]
    elif damage == "nonce":
        doc["nonce"] = b64url.encode(bytes(12))
    elif damage == "format":
        doc["format"] = "something-else"
    elif damage == "version":
        doc["v"] = 2
    blob = b"\x00not json" if damage == "garbage" else json.dumps(doc).encode()
    with pytest.raises(SealedError) as refused:
        unseal(key, blob)
    expected = {"format": "credentials_not_sealed", "version": "credentials_version"}.get(damage)
    assert refused.value.code == (expected or "credentials_tampered")


def test_a_plaintext_file_is_sealed_and_removed_at_start_and_when_dropped_in_later(tmp_path: Path) -> None:
    key = _key()
    write_private(tmp_path / PLAIN_NAME, json.dumps(CREDS).encode())
    creds = LocalCredentials(tmp_path, key)
    assert creds() == CREDS
    assert not (tmp_path / PLAIN_NAME).exists()
    sealed = (tmp_path / FILE_NAME).read_bytes()
    assert SECRET.encode() not in sealed
    assert (tmp_path / FILE_NAME).stat().st_mode & 0o777 == 0o600
    # A whole new set dropped in while it runs replaces the sealed content at the next task.
    write_private(tmp_path / PLAIN_NAME, b'{"ssh": {}}')
    assert creds() == {"ssh": {}}
    assert not (tmp_path / PLAIN_NAME).exists()


def test_a_running_collector_sees_a_change_written_sealed(tmp_path: Path) -> None:
    key = _key()
    creds = LocalCredentials(tmp_path, key)
    assert creds() == {}
    write_sealed(tmp_path, key, CREDS)
    assert creds() == CREDS
    # A sealed file that does not open later keeps the last good content.
    write_private(tmp_path / FILE_NAME, seal(_key(), {"ssh": {}}))
    assert creds() == CREDS
    with pytest.raises(ValueError, match="do not open"):
        LocalCredentials(tmp_path, key)


def _state(tmp_path: Path) -> tuple[Path, ec.EllipticCurvePrivateKey]:
    key = _key()
    save_key(StatePaths(tmp_path).key, key)
    return tmp_path, key


def test_the_command_line_sets_lists_and_removes_without_showing_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, key = _state(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(CREDS["ssh"]["sw-1"])))
    assert main(["credentials", "set", "ssh", "sw-1", "--state-dir", str(state)]) == 0
    value = tmp_path / "value.json"
    value.write_text('{"bearer": "tok-123"}')
    assert main(["credentials", "set", "http", "lb-1", "--file", str(value), "--state-dir", str(state)]) == 0
    assert read_sealed(state, key) == {**CREDS, "http": {"lb-1": {"bearer": "tok-123"}}}
    capsys.readouterr()
    assert main(["credentials", "list", "--state-dir", str(state)]) == 0
    listed = capsys.readouterr().out
    assert listed.splitlines() == ["http\tlb-1\tbearer", "ssh\tsw-1\tpassword, username"]
    assert SECRET not in listed and "tok-123" not in listed
    assert main(["credentials", "rm", "http", "lb-1", "--state-dir", str(state)]) == 0
    assert read_sealed(state, key) == CREDS
    assert main(["credentials", "rm", "http", "lb-1", "--state-dir", str(state)]) == 1
    monkeypatch.setattr("sys.stdin", io.StringIO("[1, 2]"))
    assert main(["credentials", "set", "ssh", "sw-2", "--state-dir", str(state)]) == 1
    assert "JSON object" in capsys.readouterr().err


def test_enrolling_again_with_a_new_key_carries_the_credentials_over(tmp_path: Path) -> None:
    state, old = _state(tmp_path)
    write_sealed(state, old, CREDS)
    _, new = enroll._attempt(StatePaths(state), None)
    assert load_key(StatePaths(state).key).private_numbers() == new.private_numbers()
    assert read_sealed(state, new) == CREDS
    with pytest.raises(SealedError):
        read_sealed(state, old)
