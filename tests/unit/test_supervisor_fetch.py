"""The supervisor's download path against an attacker on the wire (issue 20's TUF attack matrix).

Each attack runs the supervisor's own fetcher (collector/supervisor/fetch.py: root bootstrapped
from the pinned release keys, python-tuf's ngclient, the target checked against the signed
config) into the supervisor's install layout; each must be refused with a stable code and
nothing staged. The bytes on the wire come from the real repository writer (router/releases/update_repo.py).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata
from tuf.api.serialization.json import JSONSerializer

from collector.supervisor.fetch import ReleaseFetcher, Target, UpdateError
from collector.supervisor.layout import Layout
from common.trust.keys import KeyPurpose, KeySet
from router.releases.update_repo import UpdateRepository, tuf_key
from tests.support.tuf_wire import BASE, Wire

NOW = dt.datetime.now(dt.UTC)
NAME = "versus-collector-1.1.0-linux-x86_64.pex"


class Setup:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.keys = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)
        self.repo = UpdateRepository(tmp_path / "updates")
        self.repo.ensure(self.keys, NOW)
        self.artifact = tmp_path / NAME
        self.artifact.write_bytes(b"release 1.1.0" * 1000)
        self.repo.publish(self.keys, self.artifact, NAME, {"version": "1.1.0"}, NOW)
        published = self.repo.released()[NAME]
        self.target = Target("1.1.0", NAME, published.sha256, published.length)
        self.wire = Wire(self.repo.directory)
        self.layout = Layout(tmp_path / "install")
        self.layout.prepare()

    def fetcher(self, keys: KeySet | None = None, anchor: str | None = None) -> ReleaseFetcher:
        keys = keys or self.keys
        return ReleaseFetcher(
            self.tmp / "tuf", BASE + "metadata/", self.layout.downloads, None, None, "c1",  # type: ignore[arg-type]
            {k.kid: k.public for k in keys.keys}, anchor or keys.current_kid, fetcher=self.wire,
        )  # fmt: skip

    def install(self, target: Target | None = None, **kwargs: object) -> Path:
        """What the supervisor does before it switches: fetch, verify, stage."""
        path = self.fetcher(**kwargs).fetch(target or self.target)  # type: ignore[arg-type]
        return self.layout.stage((target or self.target).version, path)

    def refused(self, target: Target | None = None, **kwargs: object) -> str:
        with pytest.raises(UpdateError) as refused:
            self.install(target, **kwargs)
        assert list(self.layout.releases.iterdir()) == [], "something was staged"
        assert not any(p.is_file() for p in self.layout.downloads.rglob("*")), "something was kept"
        return refused.value.code


def _forget_downloads(s: Setup) -> None:
    for p in s.layout.downloads.iterdir():
        p.unlink()


def _tampered(path: Path, change: dict[str, object]) -> bytes:
    document = json.loads(path.read_text())
    document["signed"].update(change)
    return json.dumps(document).encode()


def test_a_genuine_release_is_staged(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    staged = s.install()
    assert (staged / "versus-collector.pex").read_bytes() == s.artifact.read_bytes()


def test_an_arbitrary_artifact_is_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    [stored] = (s.repo.directory / "targets").iterdir()
    s.wire.replace[f"targets/{stored.name}"] = b"evil" * (s.target.length // 4)
    assert s.refused() == "update_metadata_refused"  # LengthOrHashMismatchError


def test_endless_data_is_cut_at_the_signed_length(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    [stored] = (s.repo.directory / "targets").iterdir()
    s.wire.replace[f"targets/{stored.name}"] = s.artifact.read_bytes() + b"x" * 5_000_000
    assert s.refused() == "update_download_failed"  # DownloadLengthMismatchError


def test_a_bad_signature_and_too_few_signatures_are_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    timestamp = s.repo.directory / "metadata" / "timestamp.json"
    s.wire.replace["metadata/timestamp.json"] = _tampered(timestamp, {"version": 99})
    assert s.refused() == "update_metadata_refused"
    unsigned = json.loads(timestamp.read_text())
    unsigned["signatures"] = []
    s.wire.replace["metadata/timestamp.json"] = json.dumps(unsigned).encode()
    assert s.refused() == "update_metadata_refused"


def test_a_rollback_to_older_metadata_is_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    old_timestamp = (s.repo.directory / "metadata" / "timestamp.json").read_bytes()
    newer = tmp_path / "newer.pex"
    newer.write_bytes(b"1.2.0")
    s.repo.publish(s.keys, newer, "versus-collector-1.2.0-linux-x86_64.pex", {"version": "1.2.0"}, NOW)
    s.fetcher().fetch(s.target)  # the newer timestamp is now trusted...
    _forget_downloads(s)
    s.wire.replace["metadata/timestamp.json"] = old_timestamp
    assert s.refused() == "update_metadata_refused"  # ...and the old one is a rollback


def test_frozen_metadata_is_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    stale = UpdateRepository(tmp_path / "stale")
    stale.ensure(s.keys, NOW - dt.timedelta(days=3))  # nobody re-signed its timestamp since
    s.wire.root = stale.directory
    assert s.refused(Target("1.1.0", NAME, s.target.sha256, s.target.length)) == "update_metadata_refused"


def test_mix_and_match_is_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.wire.replace["metadata/2.targets.json"] = (
        s.repo.directory / "metadata" / "1.targets.json"
    ).read_bytes()
    assert s.refused() == "update_metadata_refused"


def test_a_fast_forward_timestamp_blocks_updates_until_the_key_is_rotated_out(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    timestamp = Metadata.from_file(str(s.repo.directory / "metadata" / "timestamp.json"))
    timestamp.signed.version = 2**31
    timestamp.signatures.clear()
    timestamp.sign(CryptoSigner(s.keys.current.private_key(), tuf_key(s.keys.current)))
    s.wire.replace["metadata/timestamp.json"] = JSONSerializer().serialize(timestamp)
    s.fetcher().fetch(s.target)  # signed by the stolen key: trusted
    _forget_downloads(s)
    del s.wire.replace["metadata/timestamp.json"]
    assert s.refused() == "update_metadata_refused"  # every genuine timestamp is now a "rollback"
    rotated = s.keys.rotate(int(NOW.timestamp()))
    s.repo.ensure(rotated, NOW)
    retired = KeySet(KeyPurpose.RELEASE, tuple(k for k in rotated.keys if k.kid != s.keys.current_kid),
                     rotated.current_kid, rotated.version + 1)  # fmt: skip
    s.repo.ensure(retired, NOW)
    s.install()  # the new root changed the timestamp role's keys: the forged timestamp is dropped


def test_a_yanked_release_is_not_installed(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.repo.remove(s.keys, NAME, NOW)
    assert s.refused() == "release_not_listed"


def test_slow_retrieval_is_bounded(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    [stored] = (s.repo.directory / "targets").iterdir()
    s.wire.stall.add(f"targets/{stored.name}")
    assert s.refused() == "update_download_failed"


def test_a_config_that_names_other_bytes_or_version_is_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    assert s.refused(Target("1.1.0", NAME, "0" * 64, s.target.length)) == "release_mismatch"
    assert s.refused(Target("9.9.9", NAME, s.target.sha256, s.target.length)) == "release_mismatch"


def test_a_root_not_held_by_the_pinned_keys_or_the_anchor_is_refused(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    other = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)
    assert s.refused(keys=other) == "update_root_not_pinned"
    assert s.refused(anchor=other.current_kid) == "update_pubkey_not_trusted"
    # The anchor may also be the key's public bytes (base64), as `versus-cp keys list` shows them.
    s.install(anchor=s.keys.current.public.to_json()["pub"])


def test_after_a_release_key_rotation_a_new_supervisor_bootstraps_from_the_newest_pinned_root(
    tmp_path: Path,
) -> None:
    s = Setup(tmp_path)
    rotated = s.keys.rotate(int(NOW.timestamp()))
    s.repo.ensure(rotated, NOW)
    retired = KeySet(KeyPurpose.RELEASE, tuple(k for k in rotated.keys if k.kid != s.keys.current_kid),
                     rotated.current_kid, rotated.version + 1)  # fmt: skip
    s.repo.ensure(retired, NOW)
    # Enrolled after the rotation: it pins only the new key, which holds root version 3.
    s.install(keys=retired)
