"""Take a backup of a deployment and restore it onto fresh hosts (docs/deployment.md, "Backup and
restore"). The archive's format and checks are common/backup/archive.py; the PostgreSQL tools
common/backup/pg_tools.py.

A restore is all or nothing and never lands on live state: the target database must be empty and
the state directory must hold no key material, so a mistyped URL cannot overwrite a running
deployment. Everything is verified (checksums, the material key opens the material, the target
server is new enough) before the first write.
"""

from __future__ import annotations

import datetime as dt
import os
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from common.backup import archive, pg_tools
from common.backup.archive import Manifest, Member
from common.config.settings import Settings
from common.db import engine as db_engine
from common.db import migrate
from common.errors import ConfigError, Conflict, FailedPrecondition
from common.material import bundle as material_bundle
from common.material import files as material_files
from common.material import store as material_store
from common.material.files import Marker
from common.trust.master_keys import MasterKeys

CHUNK = 1 << 20
# Tables in any schema a restore would write to (the system catalogs excepted).
_COUNT_TABLES = "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"


@dataclass(frozen=True, slots=True)
class Restored:
    manifest: Manifest
    database_url: str
    migrated_from: str | None  # the backup's schema revision when the restore had to migrate it


def material_keys(settings: Settings) -> MasterKeys:
    """The material key every backup and restore needs (never stored in the archive)."""
    if settings.material_key_file is None:
        raise ConfigError(
            "a backup seals the key material under the material key: set VERSUS_MATERIAL_KEY_FILE "
            "or pass --material-key (create one with `versus-cp material new-key FILE`)",
            code="material_key_required",
        )
    return MasterKeys.load(settings.material_key_file)


def _digest(path: Path, name: str) -> Member:
    digest = archive.Digest()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.member(name)


@contextmanager
def _scratch(near: Path) -> Iterator[Path]:
    """A private directory beside ``near`` (the same filesystem: the final rename is atomic)."""
    with tempfile.TemporaryDirectory(prefix=".versus-backup-", dir=near) as raw:
        path = Path(raw)
        path.chmod(0o700)
        yield path


def create(settings: Settings, out: Path) -> Manifest:
    """Write a backup of the deployment behind ``settings`` to ``out`` (mode 0600, atomically)."""
    if not settings.database_url:
        raise ConfigError("DATABASE_URL must be set, or a `versus-cp up` running on this state directory")
    url = settings.database_url
    keys = material_keys(settings)
    if out.exists():
        raise Conflict(f"{out} exists; a backup is never written over another", code="backup_exists")
    engine = db_engine.create_sync(url, pool_size=1)
    try:
        with engine.connect() as conn:
            row = material_store.get(conn)
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    if row is None:
        raise FailedPrecondition("PostgreSQL records no key material yet: start the services once first")
    major = pg_tools.server_major(url)
    tool_major, bin_dir = pg_tools.pick(major, pg_tools.available())
    with _scratch(out.resolve().parent) as scratch:
        pg_tools.dump(url, scratch / archive.DATABASE, bin_dir)
        members = {archive.DATABASE: _digest(scratch / archive.DATABASE, archive.DATABASE)}
        if row.mode == "local":
            sealed_with = _seal_local(
                settings, keys, row.material_id, row.version, scratch / archive.MATERIAL
            )
            members[archive.MATERIAL] = _digest(scratch / archive.MATERIAL, archive.MATERIAL)
        else:
            assert row.sealed is not None and row.sealed_with is not None
            # Proves now, not on the day of the restore, that this key opens what the backup holds.
            material_bundle.unseal(keys, material_store.ROW, row.version, row.sealed_with, row.sealed)
            sealed_with = row.sealed_with
        manifest = Manifest(
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            schema_revision=str(revision),
            server_major=major,
            dump_tool_major=tool_major,
            material_mode=row.mode,
            material_id=row.material_id,
            material_version=row.version,
            sealed_with=sealed_with,
            members=members,
        )
        (scratch / archive.MANIFEST).write_bytes(manifest.to_json())
        partial = scratch / "backup.tar"
        with tarfile.open(partial, "w") as tar:
            for name in (archive.MANIFEST, *members):
                tar.add(scratch / name, arcname=name, recursive=False)
        partial.chmod(0o600)
        os.replace(partial, out)
    return manifest


def _seal_local(settings: Settings, keys: MasterKeys, material_id: str, version: int, out: Path) -> str:
    state = settings.state_dir.expanduser()
    marker = material_files.read_marker(state)
    if marker is None or marker.material_id != material_id:
        raise ConfigError(
            f"this host's state directory ({state}) does not hold the deployment's key material "
            f"{material_id}: take the backup on the host whose services run",
            code="material_not_here",
        )
    bundle = material_files.read_bundle(state, material_id)
    kid, sealed = material_bundle.seal(keys, archive.SEAL_NAME, version, bundle)
    out.write_bytes(sealed)
    return kid


def read(path: Path, into: Path) -> Manifest:
    """Unpack ``path`` into ``into`` and prove every member is the one the manifest names."""
    seen: dict[str, Member] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                if info.name not in archive.MEMBERS or not info.isfile() or info.name in seen:
                    raise archive.corrupt(f"unexpected member {info.name!r}")
                source = tar.extractfile(info)
                assert source is not None
                digest = archive.Digest()
                with open(into / info.name, "wb") as sink:
                    while chunk := source.read(CHUNK):
                        digest.update(chunk)
                        sink.write(chunk)
                seen[info.name] = digest.member(info.name)
    except (tarfile.TarError, EOFError) as exc:
        raise archive.corrupt(f"not a readable tar file ({type(exc).__name__})") from None
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist", code="backup_not_found") from None
    if archive.MANIFEST not in seen:
        raise archive.corrupt("no manifest")
    manifest = archive.parse_manifest((into / archive.MANIFEST).read_bytes())
    if set(seen) - {archive.MANIFEST} != set(manifest.members):
        raise archive.corrupt("the members are not the ones the manifest lists")
    for name, expected in manifest.members.items():
        archive.check_member(expected, seen[name])
    return manifest


def verify(settings: Settings, path: Path) -> Manifest:
    """Read the archive whole and open its material with the material key: what a restore checks
    before it writes anything."""
    keys = material_keys(settings)
    with _scratch(path.resolve().parent) as scratch:
        manifest = read(path, scratch)
        _open_material(keys, manifest, scratch)
    return manifest


def _open_material(keys: MasterKeys, manifest: Manifest, scratch: Path) -> material_bundle.Bundle | None:
    if manifest.sealed_with not in keys.keys:
        raise ConfigError(
            f"the backup's key material is sealed with material key {manifest.sealed_with!r}, which "
            f"the key file does not hold",
            code="material_key_wrong",
        )
    if manifest.material_mode != "local":
        return None  # sealed in the database dump; the services open it at start
    assert manifest.sealed_with is not None
    bundle = material_bundle.unseal(
        keys, archive.SEAL_NAME, manifest.material_version, manifest.sealed_with,
        (scratch / archive.MATERIAL).read_bytes(),
    )  # fmt: skip
    if bundle.material_id != manifest.material_id or bundle.missing():
        raise archive.corrupt("the sealed material is not the deployment's or is incomplete")
    return bundle


def restore(settings: Settings, path: Path, database_url: str) -> Restored:
    """Restore ``path`` into the empty database at ``database_url`` and this host's empty state
    directory."""
    keys = material_keys(settings)
    state = settings.state_dir.expanduser()
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _scratch(path.resolve().parent) as scratch:
        manifest = read(path, scratch)
        bundle = _open_material(keys, manifest, scratch)
        if bundle is not None and (material_files.has_material(state) or material_files.read_marker(state)):
            raise Conflict(
                f"{state} already holds key material: restore onto a fresh state directory",
                code="restore_state_not_empty",
            )
        _require_empty(database_url)
        target = pg_tools.server_major(database_url)
        archive.check_restorable(manifest, target)
        _, bin_dir = pg_tools.pick(max(target, manifest.dump_tool_major), pg_tools.available())
        pg_tools.restore(database_url, scratch / archive.DATABASE, bin_dir)
    if bundle is not None:
        material_files.apply_bundle(state, bundle)
        material_files.write_marker(state, Marker(manifest.material_id, manifest.material_version, "local"))
    migrated_from = None
    if not migrate.is_current(database_url):
        migrated_from = manifest.schema_revision
        migrate.upgrade(database_url)
    return Restored(manifest, database_url, migrated_from)


def _require_empty(url: str) -> None:
    engine = db_engine.create_sync(url, pool_size=1)
    try:
        with engine.connect() as conn:
            tables = conn.execute(text(_COUNT_TABLES)).scalar()
    finally:
        engine.dispose()
    if tables:
        raise Conflict(
            f"the database at {db_engine.describe(url)} is not empty ({tables} tables): restore "
            "into a new, empty database",
            code="restore_target_not_empty",
        )
