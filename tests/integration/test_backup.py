"""`versus-cp backup` on real PostgreSQL: a backup of a deployment with local key material restores
onto an empty database and an empty state directory, and a service would start there on the same
material; every refusal happens before anything is written."""

from __future__ import annotations

import base64
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from common.backup import archive, service
from common.config.settings import Settings
from common.db import engine as db_engine
from common.db import migrate
from common.db.schema import sites
from common.errors import Conflict, InvalidArgument, VersusError
from common.material import files as material_files
from common.material.shared import Role, Source, create_local, prepare
from common.trust.master_keys import MasterKeys

pytestmark = pytest.mark.timeout(120)


def _key(path: Path) -> Path:
    path.write_bytes(MasterKeys.generate().to_json())
    path.chmod(0o600)
    return path


def _settings(state: Path, url: str, key: Path | None) -> Settings:
    return Settings(state_dir=state, database_url=url, material_key_file=key)


def _deployment(tmp_path: Path, url: str) -> Settings:
    """A deployment's database and state directory: material recorded, one site."""
    settings = _settings(tmp_path / "state-a", url, _key(tmp_path / "material.key"))
    engine = db_engine.create_sync(url, pool_size=1)
    try:
        prepare(Source.from_settings(settings), engine, Role.CORE)
        with engine.begin() as conn:
            conn.execute(insert(sites).values(site_id="site-dr", name="dr", tenant_id="t"))
    finally:
        engine.dispose()
    return settings


def _site_names(url: str) -> list[str]:
    engine = db_engine.create_sync(url, pool_size=1)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(sites.c.name)).scalars())
    finally:
        engine.dispose()


def test_a_backup_restores_onto_fresh_hosts(
    tmp_path: Path, database_url: str, empty_database_url: str
) -> None:
    source = _deployment(tmp_path, database_url)
    backup = tmp_path / "backup.tar"
    manifest = service.create(source, backup)

    assert backup.stat().st_mode & 0o777 == 0o600
    with tarfile.open(backup) as tar:
        assert sorted(tar.getnames()) == sorted(archive.MEMBERS)
    raw = backup.read_bytes()
    assert b"PRIVATE KEY" not in raw  # the material is sealed; the key file is not in it
    assert source.material_key_file is not None
    for secret in MasterKeys.load(source.material_key_file).keys.values():
        assert secret not in raw and base64.b64encode(secret) not in raw
    assert manifest.material_mode == "local" and manifest.schema_revision == migrate.HEAD_REVISION

    fresh = _settings(tmp_path / "state-b", empty_database_url, source.material_key_file)
    restored = service.restore(fresh, backup, empty_database_url)
    assert restored.migrated_from is None
    assert _site_names(empty_database_url) == ["dr"]
    assert migrate.is_current(empty_database_url)
    before = material_files.read_bundle(source.state_dir, manifest.material_id)
    after = material_files.read_bundle(fresh.state_dir, manifest.material_id)
    assert dict(after.files) == dict(before.files)
    engine = db_engine.create_sync(empty_database_url, pool_size=1)
    try:  # what a service does first at start: this host's material is the deployment's
        marker = prepare(Source.from_settings(fresh), engine, Role.CORE)
    finally:
        engine.dispose()
    assert marker.material_id == manifest.material_id


def test_refusals_write_nothing(tmp_path: Path, database_url: str, empty_database_url: str) -> None:
    source = _deployment(tmp_path, database_url)
    backup = tmp_path / "backup.tar"
    service.create(source, backup)

    def refused(settings: Settings, path: Path, url: str) -> VersusError:
        with pytest.raises(VersusError) as caught:
            service.restore(settings, path, url)
        return caught.value

    fresh = tmp_path / "state-b"
    wrong_key = _settings(fresh, empty_database_url, _key(tmp_path / "other.key"))
    assert refused(wrong_key, backup, empty_database_url).code == "material_key_wrong"
    no_key = _settings(fresh, empty_database_url, None)
    assert refused(no_key, backup, empty_database_url).code == "material_key_required"
    good = _settings(fresh, empty_database_url, source.material_key_file)
    not_empty = refused(good, backup, database_url)  # the live database itself
    assert isinstance(not_empty, Conflict) and not_empty.code == "restore_target_not_empty"

    damaged = tmp_path / "damaged.tar"
    data = bytearray(backup.read_bytes())
    with tarfile.open(backup) as tar:
        dump = tar.getmember(archive.DATABASE)
    data[dump.offset_data + dump.size // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    corrupt = refused(good, damaged, empty_database_url)
    assert isinstance(corrupt, InvalidArgument) and corrupt.code == "backup_corrupt"
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(backup.read_bytes()[:2000])
    assert refused(good, truncated, empty_database_url).code == "backup_corrupt"

    occupied = _settings(tmp_path / "occupied", empty_database_url, source.material_key_file)
    create_local(Source.from_settings(occupied))  # material of its own is never written over
    assert refused(occupied, backup, empty_database_url).code == "restore_state_not_empty"

    # None of that touched the target or the state directory.
    assert not material_files.has_material(fresh) and material_files.read_marker(fresh) is None
    engine = db_engine.create_sync(empty_database_url, pool_size=1)
    try:
        assert migrate.current_revision(empty_database_url) is None
    finally:
        engine.dispose()
    with pytest.raises(Conflict) as exists:
        service.create(source, backup)
    assert exists.value.code == "backup_exists"
