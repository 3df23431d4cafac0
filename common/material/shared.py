"""One source of truth for the deployment's key and CA material, however many hosts serve it.

Every service checks the ``key_material`` row in PostgreSQL before it loads a
key, and never mints material PostgreSQL does not know (docs/deployment.md):

- **local** (the default; one host, ``versus-cp up``): the material lives in this
  host's state directory and the row only *anchors* it by id. The first service
  to start records the id; a service on another host whose state directory holds
  other material (or none) refuses to start instead of minting its own, which
  would sign with keys no collector holds.
- **shared** (``VERSUS_KEY_MATERIAL=shared``, several hosts): the row holds the
  material sealed under the operator's material key (``VERSUS_MATERIAL_KEY_FILE``,
  common/trust/master_keys.py) and every replica writes it into its state directory
  at start and follows new versions (:class:`Follower`). A gateway (role
  ``edge``) takes only the public files and needs no material key: an edge host
  holds no private key at all.

``versus-cp material share`` turns a local deployment into a shared one. The key
and CA commands change shared material through :func:`editing`: under the row's
lock they bring this host's copy up to date, change it, and store the result as
the next version, which every replica applies within :data:`FOLLOW_INTERVAL_S`.
A replica never applies a version older than the one it holds (a restored or
tampered row), and refuses to start on one.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sqlalchemy.engine import Connection, Engine

from common.config.settings import KeyMaterialMode as MaterialMode
from common.config.settings import Settings
from common.config.state_dir import ensure_writable, locked
from common.db import engine as db_engine
from common.errors import ConfigError
from common.material import bundle as material_bundle
from common.material import files as material_files
from common.material import store as material_store
from common.material.bundle import Bundle
from common.material.files import Marker
from common.material.store import MaterialRow
from common.telemetry.logs import get_logger
from common.trust.ca_store import CaStore
from common.trust.keys import KeyPurpose
from common.trust.keystore import KeyStore
from common.trust.master_keys import CREDENTIALS_MASTER_FILE, MasterKeys

log = get_logger("versus.material")

# How often a replica asks PostgreSQL whether the shared material changed (one indexed read).
FOLLOW_INTERVAL_S = 5.0
DOCS = "docs/deployment.md#key-and-ca-material"


class Role(StrEnum):
    CORE = "core"  # router, enrollment service, operator commands: every file
    EDGE = "edge"  # gateway: the public files only


@dataclass(frozen=True, slots=True)
class Source:
    """Where this process finds the material: its state directory, the mode and the material key."""

    state: Path
    mode: MaterialMode
    key_file: Path | None = None
    # Vault mode B's master key file is part of the material unless the operator supplies one.
    default_master_file: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> Source:
        return cls(
            ensure_writable(settings.state_dir),
            settings.key_material,
            settings.material_key_file,
            settings.credentials_master_keys_file is None,
        )

    def keys(self) -> MasterKeys:
        if self.key_file is None:
            raise ConfigError(
                "VERSUS_KEY_MATERIAL=shared needs VERSUS_MATERIAL_KEY_FILE (create one with "
                f"`versus-cp material new-key FILE`; {DOCS})"
            )
        return MasterKeys.load(self.key_file)

    def required(self, role: Role) -> list[str]:
        if role is Role.EDGE:
            return ["ca/trust.json"]
        extra = [CREDENTIALS_MASTER_FILE] if self.default_master_file else []
        return [*material_bundle.REQUIRED, *extra]


def create_local(source: Source) -> None:
    """Create whatever of this host's material is missing (keys, CAs, vault mode B's master key)."""
    for purpose in KeyPurpose:
        KeyStore(source.state, purpose).load_or_create()
    CaStore(source.state).load_or_create()
    if source.default_master_file:
        MasterKeys.load_or_create(source.state / CREDENTIALS_MASTER_FILE, create=True)


def prepare(source: Source, engine: Engine, role: Role) -> Marker:
    """Make this host's copy of the material the deployment's, before any key is loaded.

    Raises :class:`ConfigError` (the service refuses to start) when this host would otherwise
    serve material PostgreSQL does not know.
    """
    with locked(source.state), engine.begin() as conn:
        row = material_store.get(conn)
        marker = material_files.read_marker(source.state)
        if source.mode is MaterialMode.SHARED:
            return _pull(source, row, marker, role)
        if row is not None and row.mode == MaterialMode.SHARED:
            raise ConfigError(
                f"PostgreSQL holds this deployment's shared key material (version {row.version}); "
                f"set VERSUS_KEY_MATERIAL=shared and VERSUS_MATERIAL_KEY_FILE on this host ({DOCS})"
            )
        if row is not None and (marker is None or marker.material_id != row.material_id):
            have = "none" if marker is None else marker.material_id
            raise ConfigError(
                f"this host's key material ({have}) is not the deployment's ({row.material_id}, first "
                f"recorded by {row.updated_by}): a replica must not mint keys of its own. Share the "
                f"material with `versus-cp material share` on {row.updated_by} ({DOCS})"
            )
        if marker is None:
            # A state directory of an earlier release keeps its keys: they are adopted, not replaced.
            create_local(source)
            marker = Marker(f"mat-{secrets.token_hex(8)}", 1, MaterialMode.LOCAL)
            material_files.write_marker(source.state, marker)
        else:
            create_local(source)
        if row is None:
            summary = material_files.read_bundle(source.state, marker.material_id).summary()
            material_store.anchor_local(conn, marker.material_id, summary)
        return marker


def _pull(source: Source, row: MaterialRow | None, marker: Marker | None, role: Role) -> Marker:
    if row is None or row.mode != MaterialMode.SHARED:
        where = "" if row is None else f" (it anchors {row.updated_by}'s local material)"
        raise ConfigError(
            f"PostgreSQL holds no shared key material{where}: run `versus-cp material share` once on "
            f"the host whose keys the fleet holds ({DOCS})"
        )
    if marker is not None and marker.material_id == row.material_id and marker.version > row.version:
        raise ConfigError(
            f"PostgreSQL's shared key material is version {row.version} but this host already applied "
            f"version {marker.version}: the row was restored from an older backup or altered. Check, "
            f"then remove {source.state / material_files.MARKER} to accept it ({DOCS})"
        )
    bundle = _open(source, row, role)
    missing = [p for p in source.required(role) if p not in bundle.files]
    if missing:
        raise ConfigError(f"the shared key material lacks {', '.join(missing)} ({DOCS})")
    material_files.apply_bundle(source.state, bundle)
    marker = Marker(row.material_id, row.version, MaterialMode.SHARED)
    material_files.write_marker(source.state, marker)
    return marker


def _open(source: Source, row: MaterialRow, role: Role) -> Bundle:
    if role is Role.EDGE:
        assert row.public is not None
        bundle = material_bundle.decode(row.public)
    else:
        assert row.sealed is not None and row.sealed_with is not None
        bundle = material_bundle.unseal(
            source.keys(), material_store.ROW, row.version, row.sealed_with, row.sealed
        )
    if bundle.material_id != row.material_id:
        raise ConfigError("the shared key material's id does not match its row: the row was altered")
    return bundle


def _store(source: Source, conn: Connection, row: MaterialRow | None, material_id: str) -> int:
    """Seal this host's copy as the row's next version; that version."""
    keys = source.keys()
    bundle = material_files.read_bundle(source.state, material_id)
    version = 1 if row is None else row.version + 1
    kid, sealed = material_bundle.seal(keys, material_store.ROW, version, bundle)
    material_store.put_shared(
        conn,
        material_id=material_id,
        version=version,
        sealed_with=kid,
        sealed=sealed,
        public=material_bundle.encode(material_bundle.public_part(bundle)),
        summary=bundle.summary(),
        exists=row is not None,
    )
    material_files.write_marker(source.state, Marker(material_id, version, MaterialMode.SHARED))
    return version


def share(source: Source, engine: Engine) -> int:
    """Turn this host's local material into the deployment's shared material; its version."""
    with locked(source.state), engine.begin() as conn:
        row = material_store.get(conn, for_update=True)
        marker = material_files.read_marker(source.state)
        if row is not None and row.mode == MaterialMode.SHARED:
            raise ConfigError(f"the key material is shared already (version {row.version})")
        if marker is None and row is None:
            # A new deployment: the material is created here and shared at once.
            create_local(source)
            marker = Marker(f"mat-{secrets.token_hex(8)}", 1, MaterialMode.LOCAL)
            material_files.write_marker(source.state, marker)
        if marker is None or (row is not None and row.material_id != marker.material_id):
            raise ConfigError(
                "this host's state directory does not hold the deployment's material"
                + (f"; run this on {row.updated_by}" if row is not None else "")
            )
        create_local(source)
        return _store(source, conn, row, marker.material_id)


def push(source: Source, engine: Engine) -> int:
    """Store this host's copy, changed by hand (vault mode B's master key file, say), as the next
    version; refused unless the copy is the newest version (a hand edit of an older one would
    undo what another host stored meanwhile)."""
    with locked(source.state), engine.begin() as conn:
        row = material_store.get(conn, for_update=True)
        marker = material_files.read_marker(source.state)
        if row is None or row.mode != MaterialMode.SHARED:
            raise ConfigError("the key material is not shared: nothing to push to")
        if marker is None or marker.material_id != row.material_id or marker.version != row.version:
            have = "none" if marker is None else f"version {marker.version}"
            raise ConfigError(
                f"this host's copy ({have}) is not the newest (version {row.version}): restart a service "
                "here to bring it up to date, make the change again, then push"
            )
        return _store(source, conn, row, marker.material_id)


def reseal(source: Source, engine: Engine) -> int:
    """Seal the shared material again under the material key file's active key (after adding
    one); every key the file lists still opens the version before."""
    with editing(source, engine):
        pass
    marker = material_files.read_marker(source.state)
    assert marker is not None
    return marker.version


@contextlib.contextmanager
def editing(source: Source, engine: Engine | None) -> Iterator[Path]:
    """The state directory to change the material in; in shared mode, brought up to date under the
    row's lock first and stored as the next version after (nothing is stored if the block raises)."""
    if source.mode is MaterialMode.LOCAL:
        yield source.state
        return
    if engine is None:
        raise ConfigError("changing shared key material needs DATABASE_URL")
    with locked(source.state), engine.begin() as conn:
        row = material_store.get(conn, for_update=True)
        marker = _pull(source, row, material_files.read_marker(source.state), Role.CORE)
        yield source.state
        version = _store(source, conn, row, marker.material_id)
        log.info("shared key material stored", version=version)


def refresh(source: Source, engine: Engine | None) -> None:
    """In shared mode, bring this host's copy up to the newest version (before reading it)."""
    if source.mode is MaterialMode.LOCAL:
        return
    if engine is None:
        raise ConfigError("reading shared key material needs DATABASE_URL")
    with locked(source.state), engine.begin() as conn:
        _pull(source, material_store.get(conn), material_files.read_marker(source.state), Role.CORE)


def status(engine: Engine) -> MaterialRow | None:
    with engine.connect() as conn:
        return material_store.get(conn)


class Follower:
    """Applies new versions of the shared material to this host while a service runs."""

    def __init__(self, source: Source, engine: Engine, role: Role, marker: Marker):
        self.source, self.engine, self.role = source, engine, role
        self.version = marker.version

    def check(self) -> bool:
        """Apply a newer version if there is one; whether one was applied."""
        with self.engine.connect() as conn:
            newest = material_store.version(conn)
        if newest is None or newest <= self.version:
            if newest is not None and newest < self.version:
                log.error(
                    "shared key material went back a version; not applied", have=self.version, row=newest
                )
            return False
        with locked(self.source.state), self.engine.begin() as conn:
            row = material_store.get(conn)
            marker = _pull(self.source, row, material_files.read_marker(self.source.state), self.role)
        self.version = marker.version
        log.info("shared key material applied", version=marker.version)
        return True

    async def run(self, stop: asyncio.Event, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Check every ``interval_s`` until ``stop``; then release the engine."""
        try:
            while not stop.is_set():
                try:
                    await asyncio.to_thread(self.check)
                except Exception:  # PostgreSQL away, a bad row: keep serving what this host has
                    log.warning("following the shared key material failed; retrying", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval_s):
                        await stop.wait()
        finally:
            self.engine.dispose()


async def start_service(settings: Settings, database_url: str, role: Role) -> Follower | None:
    """At a service's start: :func:`prepare` (the service refuses to start on a
    :class:`ConfigError`), then, in shared mode, the follower to run beside it."""
    source = Source.from_settings(settings)
    edge_shared = role is Role.EDGE and source.mode is MaterialMode.SHARED
    if edge_shared and settings.gateway_tls and settings.tls_cert_file is None:
        raise ConfigError(
            "a gateway in shared key material mode holds no CA key: give it a server certificate "
            "(`versus-cp ca issue-server-cert`) with VERSUS_TLS_CERT_FILE and VERSUS_TLS_KEY_FILE, "
            f"or VERSUS_GATEWAY_TLS=false behind a TLS-terminating edge ({DOCS})"
        )
    engine = db_engine.create_sync(database_url, pool_size=1, application_name=f"versus-material-{role}")
    try:
        marker = await asyncio.to_thread(prepare, source, engine, role)
    except BaseException:
        engine.dispose()
        raise
    if source.mode is MaterialMode.LOCAL:
        engine.dispose()
        return None
    return Follower(source, engine, role, marker)
