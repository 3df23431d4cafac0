"""A release's SBOM travels as a TUF target of its own, signed in the same targets version as the
artifact (router/releases/update_repo.py): a client verifies and downloads it like the artifact, and a
yank withdraws both."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from tuf.ngclient import Updater

from common.errors import FailedPrecondition
from common.trust.keys import KeyPurpose, KeySet
from router.releases.update_repo import UpdateRepository
from tests.support.tuf_wire import BASE, Wire

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
ARTIFACT, SBOM = "versus-collector-1.1.0-linux-x86_64.pex", "versus-collector-1.1.0-linux-x86_64.cdx.json"


def _published(tmp_path: Path) -> tuple[UpdateRepository, KeySet, bytes, bytes]:
    keys = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)
    repo = UpdateRepository(tmp_path / "updates")
    repo.ensure(keys, NOW)
    artifact, sbom = tmp_path / "artifact", tmp_path / "sbom"
    artifact.write_bytes(b"release 1.1.0" * 1000)
    sbom.write_bytes(b'{"bomFormat": "CycloneDX"}')
    repo.publish(keys, artifact, ARTIFACT, {"version": "1.1.0", "sbom": {"target": SBOM}}, NOW,
                 [(sbom, SBOM, {"sbom_of": ARTIFACT})])  # fmt: skip
    return repo, keys, artifact.read_bytes(), sbom.read_bytes()


def _client(tmp_path: Path, repo: UpdateRepository) -> Updater:
    local = tmp_path / "client"
    (local / "targets").mkdir(parents=True, exist_ok=True)
    updater = Updater(str(local / "metadata"), BASE + "metadata/", str(local / "targets"), BASE + "targets/",
                      fetcher=Wire(repo.directory), bootstrap=repo.root_json(1))  # fmt: skip
    updater.refresh()
    return updater


def test_the_sbom_is_signed_with_the_artifact_in_one_targets_version(tmp_path: Path) -> None:
    repo, _, artifact, sbom = _published(tmp_path)
    # Root 1 and one targets version on top of the empty one: artifact and SBOM arrived together.
    assert sorted(p.name for p in (repo.directory / "metadata").glob("*.targets.json")) == [
        "1.targets.json", "2.targets.json",
    ]  # fmt: skip
    client = _client(tmp_path, repo)
    for name, expected in ((ARTIFACT, artifact), (SBOM, sbom)):
        info = client.get_targetinfo(name)
        assert info is not None
        assert Path(client.download_target(info, str(tmp_path / name))).read_bytes() == expected
    assert repo.released()[SBOM].custom == {"sbom_of": ARTIFACT}


def test_a_name_already_published_refuses_the_whole_release(tmp_path: Path) -> None:
    repo, keys, _, _ = _published(tmp_path)
    other, sbom = tmp_path / "other", tmp_path / "other-sbom"
    other.write_bytes(b"another artifact")
    sbom.write_bytes(b"{}")
    with pytest.raises(FailedPrecondition) as refused:
        repo.publish(keys, other, "versus-collector-1.2.0.pex", {}, NOW, [(sbom, SBOM, {})])
    assert refused.value.code == "release_exists"
    assert set(repo.released()) == {ARTIFACT, SBOM}  # nothing of the refused release was signed


def test_a_yank_withdraws_the_sbom_with_the_artifact(tmp_path: Path) -> None:
    repo, keys, _, _ = _published(tmp_path)
    repo.remove(keys, ARTIFACT, NOW, also=[SBOM])
    client = _client(tmp_path, repo)
    assert client.get_targetinfo(ARTIFACT) is None and client.get_targetinfo(SBOM) is None
