"""Key and CA material across hosts, against real PostgreSQL: one source of truth, never a second mint.

Each "host" is its own state directory; the row in PostgreSQL is what they share.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.engine import Engine

from common.config.settings import KeyMaterialMode
from common.config.state_dir import write_private
from common.db import engine as db_engine
from common.db.schema import key_material
from common.errors import ConfigError
from common.material import files as material_files
from common.material import shared as material
from common.material.shared import Role, Source
from common.trust.ca_store import CaStore
from common.trust.keys import KeyPurpose
from common.trust.keystore import KeyStore
from common.trust.master_keys import MasterKeys

pytestmark = pytest.mark.timeout(60)

LOCAL, SHARED = KeyMaterialMode.LOCAL, KeyMaterialMode.SHARED


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = db_engine.create_sync(database_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "material.key"
    write_private(path, MasterKeys.generate().to_json())
    return path


def _host(tmp_path: Path, name: str, mode: KeyMaterialMode, key_file: Path | None = None) -> Source:
    state = tmp_path / name
    state.mkdir()
    return Source(state, mode, key_file)


def _kids(state: Path, purpose: KeyPurpose = KeyPurpose.DISPATCH) -> list[str]:
    return [k.kid for k in KeyStore(state, purpose).load().keys]


def test_a_second_host_with_keys_of_its_own_refuses_to_start(tmp_path: Path, engine: Engine) -> None:
    first = _host(tmp_path, "a", LOCAL)
    marker = material.prepare(first, engine, Role.CORE)
    # The same host again (a restart, another service beside it) is the same material.
    assert material.prepare(first, engine, Role.CORE) == marker
    second = _host(tmp_path, "b", LOCAL)
    with pytest.raises(ConfigError, match=r"this host's key material \(none\) is not the deployment's"):
        material.prepare(second, engine, Role.CORE)
    # It minted nothing while refusing.
    assert not KeyStore(second.state, KeyPurpose.DISPATCH).exists()


def test_shared_material_reaches_every_replica_and_a_rotation_follows(
    tmp_path: Path, engine: Engine, key_file: Path
) -> None:
    origin = _host(tmp_path, "a", LOCAL)
    material.prepare(origin, engine, Role.CORE)
    kids = _kids(origin.state)
    # Version 1 was the local anchor; the shared versions follow it.
    assert material.share(Source(origin.state, SHARED, key_file), engine) == 2

    replica = _host(tmp_path, "b", SHARED, key_file)
    marker = material.prepare(replica, engine, Role.CORE)
    assert marker.version == 2 and _kids(replica.state) == kids
    original = KeyStore(origin.state, KeyPurpose.DISPATCH).load().current
    copied = KeyStore(replica.state, KeyPurpose.DISPATCH).load().current
    assert copied.sign(b"x") == original.sign(b"x")  # Ed25519 is deterministic: the same private key
    assert CaStore(replica.state).load().active == CaStore(origin.state).load().active

    # A rotation on the replica is the next version; the origin's follower applies it.
    follower = material.Follower(Source(origin.state, SHARED, key_file), engine, Role.CORE, marker)
    with material.editing(replica, engine) as state:
        KeyStore(state, KeyPurpose.DISPATCH).rotate(grace_s=0)
    rotated = _kids(replica.state)
    assert len(rotated) == len(kids) + 1
    assert follower.check() is True
    assert _kids(origin.state) == rotated
    assert follower.check() is False  # nothing newer


def test_a_gateway_host_receives_public_files_only(tmp_path: Path, engine: Engine, key_file: Path) -> None:
    origin = _host(tmp_path, "a", LOCAL)
    material.prepare(origin, engine, Role.CORE)
    material.share(Source(origin.state, SHARED, key_file), engine)
    edge = _host(tmp_path, "gw", SHARED)  # no material key at all
    material.prepare(edge, engine, Role.EDGE)
    files = [p for p in edge.state.rglob("*") if p.is_file() and p.name != ".lock"]
    assert (edge.state / "ca" / "trust.json").exists()
    assert not [p for p in files if p.suffix in (".key",) or (p.name.endswith(".pem") and "keys" in p.parts)]
    assert not (edge.state / "credentials-master-keys.json").exists()
    assert all(p.stat().st_mode & 0o077 for p in files if p.name != "material.json")
    assert CaStore(edge.state).load().active == CaStore(origin.state).load().active


def test_refusals_name_what_is_wrong(tmp_path: Path, engine: Engine, key_file: Path) -> None:
    with pytest.raises(ConfigError, match="holds no shared key material"):
        material.prepare(_host(tmp_path, "early", SHARED, key_file), engine, Role.CORE)
    origin = _host(tmp_path, "a", LOCAL)
    material.prepare(origin, engine, Role.CORE)
    material.share(Source(origin.state, SHARED, key_file), engine)
    # A host still configured for local material, now that it is shared.
    with pytest.raises(ConfigError, match="set VERSUS_KEY_MATERIAL=shared"):
        material.prepare(origin, engine, Role.CORE)
    with pytest.raises(ConfigError, match="needs VERSUS_MATERIAL_KEY_FILE"):
        material.prepare(_host(tmp_path, "nokey", SHARED), engine, Role.CORE)
    wrong = tmp_path / "wrong.key"
    write_private(wrong, MasterKeys.generate().to_json())
    with pytest.raises(ConfigError, match="VERSUS_MATERIAL_KEY_FILE does not hold"):
        material.prepare(_host(tmp_path, "wrong", SHARED, wrong), engine, Role.CORE)


def test_a_row_that_went_back_a_version_is_not_applied(
    tmp_path: Path, engine: Engine, key_file: Path
) -> None:
    origin = _host(tmp_path, "a", LOCAL)
    material.prepare(origin, engine, Role.CORE)
    shared = Source(origin.state, SHARED, key_file)
    material.share(shared, engine)
    replica = _host(tmp_path, "b", SHARED, key_file)
    with material.editing(shared, engine) as state:
        KeyStore(state, KeyPurpose.DISPATCH).rotate(grace_s=0)
    assert material.prepare(replica, engine, Role.CORE).version == 3
    # Restore an old row (its sealed copy would not open as another version, so just the number).
    with engine.begin() as conn:
        conn.execute(update(key_material).values(version=2))
    with pytest.raises(ConfigError, match="already applied version 3"):
        material.prepare(replica, engine, Role.CORE)
    follower = material.Follower(replica, engine, Role.CORE, material_files.Marker("x", 3, "shared"))
    assert follower.check() is False
    assert len(_kids(replica.state)) == 2


def test_a_new_deployment_creates_and_shares_its_material_in_one_step(
    tmp_path: Path, engine: Engine, key_file: Path
) -> None:
    first = _host(tmp_path, "a", SHARED, key_file)
    assert material.share(first, engine) == 1
    assert material.prepare(_host(tmp_path, "b", SHARED, key_file), engine, Role.CORE).version == 1
    with pytest.raises(ConfigError, match="shared already"):
        material.share(first, engine)


def test_a_hand_edit_of_the_newest_copy_is_pushed_to_every_replica(
    tmp_path: Path, engine: Engine, key_file: Path
) -> None:
    first = _host(tmp_path, "a", SHARED, key_file)
    material.share(first, engine)
    second = _host(tmp_path, "b", SHARED, key_file)
    marker = material.prepare(second, engine, Role.CORE)
    master = first.state / "credentials-master-keys.json"
    rotated = MasterKeys.load(master)
    added = MasterKeys.generate()
    both = MasterKeys(added.active, {**rotated.keys, **added.keys})
    write_private(master, both.to_json())
    assert material.push(first, engine) == marker.version + 1
    follower = material.Follower(second, engine, Role.CORE, marker)
    assert follower.check() is True
    assert MasterKeys.load(second.state / "credentials-master-keys.json") == both
    # A host whose copy fell behind (it has not followed the last push) is refused.
    stale = _host(tmp_path, "c", SHARED, key_file)
    material.prepare(stale, engine, Role.CORE)
    material.push(second, engine)  # second is newest: fine
    with pytest.raises(ConfigError, match="is not the newest"):
        material.push(stale, engine)
