"""The update repository shared by hosts through real PostgreSQL: what one router publishes, another
host serves byte for byte and python-tuf's client verifies; writers build on each other's versions."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.engine import Engine
from tuf.ngclient import Updater

from common.db import engine as db_engine
from common.db.schema import update_file_chunks
from common.errors import ConfigError
from common.trust.keys import KeyPurpose, KeySet
from common.updates.repo_sync import SharedDirectory
from router.releases.update_share import SharedUpdateRepository
from tests.support.tuf_wire import BASE, Wire

pytestmark = pytest.mark.timeout(60)

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = db_engine.create_sync(database_url, pool_size=2)
    yield engine
    engine.dispose()


def _host(tmp_path: Path, name: str, engine: Engine) -> SharedUpdateRepository:
    return SharedUpdateRepository(SharedDirectory(tmp_path / name / "updates", engine))


def _publish(tmp_path: Path, repo: SharedUpdateRepository, keys: KeySet, version: str) -> None:
    artifact = tmp_path / f"versus-collector-{version}.pex"
    artifact.write_bytes(f"release {version}".encode() * 2000)
    repo.publish(keys, artifact, artifact.name, {"version": version, "channel": "stable"}, NOW)


def _version(repo: SharedUpdateRepository, role: str) -> int:
    name = (
        "timestamp.json"
        if role == "timestamp"
        else max((p.name for p in repo.metadata.glob(f"*.{role}.json")), key=lambda n: int(n.split(".")[0]))
    )
    return int(json.loads((repo.metadata / name).read_text())["signed"]["version"])


def test_what_one_host_publishes_another_serves_and_a_client_verifies(tmp_path: Path, engine: Engine) -> None:
    keys = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)
    router_a, gateway = _host(tmp_path, "a", engine), _host(tmp_path, "gw", engine)
    router_a.ensure(keys, NOW)
    _publish(tmp_path, router_a, keys, "1.1.0")
    assert gateway.shared.check() is True
    assert gateway.shared.check() is False  # nothing newer
    for path in (router_a.directory / "metadata").iterdir():
        assert (gateway.metadata / path.name).read_bytes() == path.read_bytes()

    local = tmp_path / "client"
    (local / "targets").mkdir(parents=True)
    updater = Updater(str(local / "metadata"), BASE + "metadata/", str(local / "targets"), BASE + "targets/",
                      fetcher=Wire(gateway.directory), bootstrap=gateway.root_json(1))  # fmt: skip
    updater.refresh()
    info = updater.get_targetinfo("versus-collector-1.1.0.pex")
    assert info is not None
    assert Path(updater.download_target(info)).read_bytes() == b"release 1.1.0" * 2000


def test_a_second_writer_builds_on_the_first_writers_versions(tmp_path: Path, engine: Engine) -> None:
    keys = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)
    router_a, router_b = _host(tmp_path, "a", engine), _host(tmp_path, "b", engine)
    router_a.ensure(keys, NOW)
    _publish(tmp_path, router_a, keys, "1.1.0")
    seen = _version(router_a, "timestamp")
    # B has not followed yet: its write pulls first, under the writers' lock.
    _publish(tmp_path, router_b, keys, "1.2.0")
    assert _version(router_b, "timestamp") == seen + 1
    assert set(router_b.released()) == {"versus-collector-1.1.0.pex", "versus-collector-1.2.0.pex"}
    router_a.shared.check()
    assert set(router_a.released()) == set(router_b.released())
    assert _version(router_a, "targets") == _version(router_b, "targets")


def test_a_file_altered_in_postgresql_is_not_written(tmp_path: Path, engine: Engine) -> None:
    keys = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)
    _host(tmp_path, "a", engine).ensure(keys, NOW)
    with engine.begin() as conn:
        conn.execute(update(update_file_chunks).values(data=b"{}"))
    gateway = _host(tmp_path, "gw", engine)
    with pytest.raises(ConfigError, match="does not match its SHA-256"):
        gateway.shared.check()
    assert not gateway.exists()
