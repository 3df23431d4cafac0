"""The releases' TUF repository against python-tuf's own client (ngclient), with an attacker on the wire.

The client reads the repository through a fetcher that serves its files, or what the attacker
put in their place; each attack must be refused with nothing downloaded.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api import exceptions
from tuf.api.metadata import Metadata
from tuf.api.serialization.json import JSONSerializer
from tuf.ngclient import Updater

from common.errors import FailedPrecondition, InvalidArgument
from common.limits import MAX_ARTIFACT_BYTES
from common.trust.keys import KeyPurpose, KeySet
from router.releases.update_repo import UpdateRepository, tuf_key
from tests.support.tuf_wire import BASE, Wire

# The client checks expiry against the real clock: the repository is signed as of now (a fixed
# date made every test fail a day after it, once the timestamp's one-day lifetime ran out).
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


def _keys() -> KeySet:
    return KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)


def _repo(tmp_path: Path, keys: KeySet) -> tuple[UpdateRepository, Path]:
    repo = UpdateRepository(tmp_path / "updates")
    repo.ensure(keys, NOW)
    artifact = tmp_path / "versus-collector-1.1.0.whl"
    artifact.write_bytes(b"release 1.1.0" * 1000)
    repo.publish(keys, artifact, artifact.name, {"version": "1.1.0", "channel": "stable"}, NOW)
    return repo, artifact


def _client(tmp_path: Path, repo: UpdateRepository, wire: Wire, root: bytes | None = None) -> Updater:
    local = tmp_path / "client"
    (local / "targets").mkdir(parents=True, exist_ok=True)
    return Updater(
        str(local / "metadata"),
        BASE + "metadata/",
        str(local / "targets"),
        BASE + "targets/",
        fetcher=wire,
        bootstrap=root if root is not None else repo.root_json(1),
    )


def _download(updater: Updater, name: str) -> bytes:
    updater.refresh()
    info = updater.get_targetinfo(name)
    assert info is not None, f"{name} is not listed"
    return Path(updater.download_target(info)).read_bytes()


def _tamper(path: Path, change: dict[str, object]) -> bytes:
    document = json.loads(path.read_text())
    document["signed"].update(change)
    return json.dumps(document).encode()


def test_a_published_release_downloads_and_verifies(tmp_path: Path) -> None:
    keys = _keys()
    repo, artifact = _repo(tmp_path, keys)
    wire = Wire(repo.directory)
    assert _download(_client(tmp_path, repo, wire), artifact.name) == artifact.read_bytes()
    [published] = repo.released().values()
    assert published.custom == {"version": "1.1.0", "channel": "stable"}


def test_an_arbitrary_artifact_is_refused(tmp_path: Path) -> None:
    repo, artifact = _repo(tmp_path, _keys())
    wire = Wire(repo.directory)
    [stored] = (repo.directory / "targets").iterdir()
    wire.replace[f"targets/{stored.name}"] = b"evil" * (len(artifact.read_bytes()) // 4)
    with pytest.raises(exceptions.LengthOrHashMismatchError):
        _download(_client(tmp_path, repo, wire), artifact.name)


def test_endless_data_is_cut_at_the_signed_length(tmp_path: Path) -> None:
    repo, artifact = _repo(tmp_path, _keys())
    wire = Wire(repo.directory)
    [stored] = (repo.directory / "targets").iterdir()
    wire.replace[f"targets/{stored.name}"] = artifact.read_bytes() + b"x" * 10_000_000
    with pytest.raises(exceptions.DownloadLengthMismatchError):
        _download(_client(tmp_path, repo, wire), artifact.name)


def test_bad_signature_and_too_few_signatures_are_refused(tmp_path: Path) -> None:
    repo, _artifact = _repo(tmp_path, _keys())
    timestamp = repo.directory / "metadata" / "timestamp.json"
    forged = Wire(repo.directory)
    forged.replace["metadata/timestamp.json"] = _tamper(timestamp, {"version": 99})
    with pytest.raises(exceptions.UnsignedMetadataError):
        _client(tmp_path / "a", repo, forged).refresh()
    unsigned = json.loads(timestamp.read_text())
    unsigned["signatures"] = []
    stripped = Wire(repo.directory)
    stripped.replace["metadata/timestamp.json"] = json.dumps(unsigned).encode()
    with pytest.raises(exceptions.UnsignedMetadataError):
        _client(tmp_path / "b", repo, stripped).refresh()


def test_rollback_to_older_metadata_is_refused(tmp_path: Path) -> None:
    keys = _keys()
    repo, _artifact = _repo(tmp_path, keys)
    wire = Wire(repo.directory)
    old_timestamp = (repo.directory / "metadata" / "timestamp.json").read_bytes()
    newer = tmp_path / "versus-collector-1.2.0.whl"
    newer.write_bytes(b"release 1.2.0")
    repo.publish(keys, newer, newer.name, {"version": "1.2.0"}, NOW)
    client = _client(tmp_path, repo, wire)
    client.refresh()
    wire.replace["metadata/timestamp.json"] = old_timestamp
    with pytest.raises(exceptions.BadVersionNumberError):
        _client(tmp_path, repo, wire).refresh()


def test_frozen_metadata_expires(tmp_path: Path) -> None:
    keys = _keys()
    repo = UpdateRepository(tmp_path / "updates")
    repo.ensure(keys, NOW - dt.timedelta(days=3))  # nobody re-signed the timestamp since
    with pytest.raises(exceptions.ExpiredMetadataError):
        _client(tmp_path, repo, Wire(repo.directory)).refresh()
    repo.ensure(keys, dt.datetime.now(dt.UTC))  # the router's refresh re-signs it
    _client(tmp_path / "again", repo, Wire(repo.directory)).refresh()


def test_mix_and_match_snapshot_is_refused(tmp_path: Path) -> None:
    keys = _keys()
    repo, _artifact = _repo(tmp_path, keys)
    # An attacker serves targets version 1 (no releases) under the snapshot that names version 2.
    wire = Wire(repo.directory)
    wire.replace["metadata/2.targets.json"] = (repo.directory / "metadata" / "1.targets.json").read_bytes()
    with pytest.raises(exceptions.BadVersionNumberError):
        _client(tmp_path, repo, wire).refresh()


def test_a_yanked_release_is_no_longer_offered(tmp_path: Path) -> None:
    keys = _keys()
    repo, artifact = _repo(tmp_path, keys)
    repo.remove(keys, artifact.name, NOW)
    client = _client(tmp_path, repo, Wire(repo.directory))
    client.refresh()
    assert client.get_targetinfo(artifact.name) is None


def test_a_client_follows_a_release_key_rotation_through_root_versions(tmp_path: Path) -> None:
    keys = _keys()
    repo, _artifact = _repo(tmp_path, keys)
    first_root = repo.root_json(1)
    rotated = keys.rotate(int(NOW.timestamp()))
    newer = tmp_path / "versus-collector-1.2.0.whl"
    newer.write_bytes(b"release 1.2.0")
    repo.publish(rotated, newer, newer.name, {"version": "1.2.0"}, NOW)  # signed with the new key
    assert json.loads(repo.root_json())["signed"]["version"] == 2
    # A client that trusts only the first root walks to the second and takes the new release.
    assert (
        _download(_client(tmp_path, repo, Wire(repo.directory), first_root), newer.name) == b"release 1.2.0"
    )


def test_releases_are_immutable_and_bounded(tmp_path: Path) -> None:
    keys = _keys()
    repo, artifact = _repo(tmp_path, keys)
    with pytest.raises(FailedPrecondition) as again:
        repo.publish(keys, artifact, artifact.name, {}, NOW)
    assert again.value.code == "release_exists"
    with pytest.raises(InvalidArgument) as named:
        repo.publish(keys, artifact, "../escape", {}, NOW)
    assert named.value.code == "release_name_invalid"
    huge = tmp_path / "huge.whl"
    with huge.open("wb") as fh:  # sparse: no disk is used
        fh.truncate(MAX_ARTIFACT_BYTES + 1)
    with pytest.raises(InvalidArgument) as large:
        repo.publish(keys, huge, huge.name, {}, NOW)
    assert large.value.code == "artifact_too_large"


def test_a_fast_forward_with_a_stolen_key_is_undone_by_rotating_it_out(tmp_path: Path) -> None:
    keys = _keys()
    repo, artifact = _repo(tmp_path, keys)
    wire = Wire(repo.directory)
    _client(tmp_path, repo, wire).refresh()
    # Whoever stole the release key signs a timestamp with a huge version; the client takes it...
    timestamp = Metadata.from_file(str(repo.directory / "metadata" / "timestamp.json"))
    timestamp.signed.version = 2**31
    timestamp.signatures.clear()
    timestamp.sign(CryptoSigner(keys.current.private_key(), tuf_key(keys.current)))
    wire.replace["metadata/timestamp.json"] = JSONSerializer().serialize(timestamp)
    _client(tmp_path, repo, wire).refresh()
    # ...and would refuse every genuine timestamp after it (all have lower versions).
    del wire.replace["metadata/timestamp.json"]
    with pytest.raises(exceptions.BadVersionNumberError):
        _client(tmp_path, repo, wire).refresh()
    # The operator rotates the key and retires the stolen one; the new root changes the timestamp
    # role's keys, so the client drops the forged timestamp and takes the genuine one again.
    rotated = keys.rotate(int(NOW.timestamp()))
    repo.ensure(rotated, NOW)
    retired = KeySet(KeyPurpose.RELEASE, tuple(k for k in rotated.keys if k.kid != keys.current_kid),
                     rotated.current_kid, rotated.version + 1)  # fmt: skip
    repo.ensure(retired, NOW)
    assert _download(_client(tmp_path, repo, wire), artifact.name) == artifact.read_bytes()
