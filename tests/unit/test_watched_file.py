"""Files re-read on change: credentials and token files rotate without a restart."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from collector.credentials import LocalCredentials
from common.config.state_dir import write_private
from common.config.watched_file import WatchedFile
from common.errors import ConfigError, Unauthenticated
from common.grpc.token_files import TokenFile


def _json(path: Path) -> WatchedFile[object]:
    return WatchedFile(path, json.loads, None)


def test_a_replaced_file_is_read_again_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_private(path, b'{"v": 1}')
    watched = _json(path)
    assert watched.get() == {"v": 1}
    assert watched.get() == {"v": 1} and watched.reloads == 0
    write_private(path, b'{"v": 2}')
    assert watched.get() == {"v": 2} and watched.reloads == 1


def test_a_change_that_does_not_parse_keeps_the_last_good_value(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_private(path, b'{"v": 1}')
    watched = _json(path)
    watched.get()
    with path.open("w") as f:  # an editor saving in place, half-way
        f.write('{"v": ')
    assert watched.get() == {"v": 1}
    write_private(path, b'{"v": 3}')
    assert watched.get() == {"v": 3}


def test_a_missing_file_is_the_missing_value_and_a_bad_first_read_raises(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    watched = _json(path)
    assert watched.get() is None
    path.write_text("not json")
    with pytest.raises(json.JSONDecodeError):
        _json(path).get()
    write_private(path, b"[1]")
    assert watched.get() == [1]
    path.unlink()
    assert watched.get() is None


KEY = ec.generate_private_key(ec.SECP256R1())


def test_credentials_refuse_a_loose_file_at_start_and_keep_the_last_good_one_later(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text('{"http": {}}')
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        LocalCredentials(tmp_path, KEY)
    path.chmod(0o600)
    creds = LocalCredentials(tmp_path, KEY)
    assert creds() == {"http": {}}
    path.write_text('{"http": {"lb-1": {"bearer": "x"}}}')
    path.chmod(0o640)
    assert creds() == {"http": {}}
    assert "bearer" not in repr(creds)


def test_a_snapshot_taken_for_a_task_does_not_change_under_it(tmp_path: Path) -> None:
    write_private(tmp_path / "credentials.json", b'{"ssh": {"sw-1": {"password": "old"}}}')
    creds = LocalCredentials(tmp_path, KEY)
    snapshot = creds()
    write_private(tmp_path / "credentials.json", b'{"ssh": {}}')
    assert snapshot["ssh"]["sw-1"]["password"] == "old"
    assert creds() == {"ssh": {}}


def test_credentials_that_are_not_an_object_are_refused(tmp_path: Path) -> None:
    write_private(tmp_path / "credentials.json", b"[]")
    with pytest.raises(ValueError, match="JSON object"):
        LocalCredentials(tmp_path, KEY)


def test_a_token_file_is_read_per_use(tmp_path: Path) -> None:
    path = tmp_path / "service-token"
    with pytest.raises(ConfigError):
        TokenFile(path)
    write_private(path, b"first\n")
    token = TokenFile(path)
    assert token() == "first"
    write_private(path, b"second\n")
    assert token() == "second"
    write_private(path, b"\n")  # an empty replacement keeps the last good token
    assert token() == "second"
    assert "second" not in repr(token)
    os.unlink(path)
    with pytest.raises(Unauthenticated):
        token()
