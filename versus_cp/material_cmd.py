"""`versus-cp material`: where the deployment's key and CA material lives, and sharing it.

    versus-cp material status [--json]
    versus-cp material new-key FILE
    versus-cp material share
    versus-cp material reseal
    versus-cp material push

One host (``versus-cp up``) keeps the material in its state directory and
PostgreSQL only records which material that is. To run replicas on several hosts,
create a material key on the host that holds the keys (``new-key``), run
``share`` there with ``VERSUS_MATERIAL_KEY_FILE`` set, copy the key file to the
router and enrollment hosts (never to gateways), and set
``VERSUS_KEY_MATERIAL=shared`` everywhere. ``reseal`` seals the material again
under the key file's active key after a key was added; ``push`` stores a change
made by hand to this host's copy (vault mode B's master key file, whose
rotation docs/vault.md describes) as the next version. docs/deployment.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from common.config.settings import KeyMaterialMode, Settings
from common.config.state_dir import write_private
from common.db import engine as db_engine
from common.errors import ConfigError
from common.material import files as material_files
from common.material import shared as material
from common.trust.master_keys import MasterKeys
from versus_cp.output import fields


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="material_action", required=True, metavar="ACTION")
    status = sub.add_parser("status", help="Which material PostgreSQL serves, and this host's copy.")
    status.add_argument("--json", action="store_true")
    new_key = sub.add_parser("new-key", help="Write a new material key file (mode 0600).")
    new_key.add_argument("file", type=Path)
    sub.add_parser("share", help="Seal this host's material into PostgreSQL for every replica.")
    sub.add_parser("reseal", help="Seal the shared material again under the key file's active key.")
    sub.add_parser(
        "push",
        help="Store this host's copy, changed by hand (the vault master key file), as the next version.",
    )


@contextlib.contextmanager
def _engine(settings: Settings, needed: bool) -> Iterator[Engine | None]:
    if not settings.database_url:
        if needed:
            raise ConfigError("DATABASE_URL must be set: the key material's record is in PostgreSQL")
        yield None
        return
    engine = db_engine.create_sync(settings.database_url, pool_size=1)
    try:
        yield engine
    finally:
        engine.dispose()


@contextlib.contextmanager
def editing(settings: Settings) -> Iterator[Path]:
    """The state directory for a key or CA command to change; in shared mode the change is stored
    as the next version of the shared material, which every replica follows."""
    source = material.Source.from_settings(settings)
    with (
        _engine(settings, source.mode is KeyMaterialMode.SHARED) as engine,
        material.editing(source, engine) as state,
    ):
        yield state


def current_state(settings: Settings) -> Path:
    """The state directory to read material from, up to date in shared mode."""
    source = material.Source.from_settings(settings)
    with _engine(settings, source.mode is KeyMaterialMode.SHARED) as engine:
        material.refresh(source, engine)
    return source.state


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.material_action == "new-key":
        path: Path = args.file
        if path.exists():
            raise ConfigError(f"{path} exists; a material key is never overwritten")
        keys = MasterKeys.generate()
        write_private(path, keys.to_json())
        print(f"material key {keys.active} written to {path} (mode 0600); keep a copy off this host")
        return 0
    source = material.Source.from_settings(settings)
    with _engine(settings, True) as engine:
        assert engine is not None
        if args.material_action == "share":
            version = material.share(source, engine)
            print(f"key material shared (version {version}); set VERSUS_KEY_MATERIAL=shared on every host")
            return 0
        if args.material_action == "push":
            version = material.push(source, engine)
            print(f"key material stored (version {version}); every replica follows it within seconds")
            return 0
        if args.material_action == "reseal":
            version = material.reseal(source, engine)
            print(f"key material sealed again (version {version})")
            return 0
        row = material.status(engine)
    marker = material_files.read_marker(source.state)
    doc: dict[str, Any] = {
        "mode": row.mode if row else None,
        "material_id": row.material_id if row else None,
        "version": row.version if row else None,
        "sealed_with": row.sealed_with if row else None,
        "updated_by": row.updated_by if row else None,
        "updated_at": row.updated_at.isoformat() if row else None,
        "summary": row.summary if row else {},
        "this_host": None
        if marker is None
        else {"material_id": marker.material_id, "version": marker.version, "mode": marker.mode},
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    if row is None:
        print("PostgreSQL records no key material yet: the first service to start records its own")
        return 0
    print(
        fields(
            [
                ("mode", row.mode),
                ("material", row.material_id),
                ("version", row.version),
                ("sealed with", row.sealed_with or "-"),
                ("updated", f"{doc['updated_at']} by {row.updated_by}"),
                ("dispatch keys", ", ".join(row.summary.get("dispatch", {}).get("kids", []))),
                ("release keys", ", ".join(row.summary.get("release", {}).get("kids", []))),
                ("collector CAs", ", ".join(row.summary.get("collector_cas", []))),
                ("gateway CAs", ", ".join(row.summary.get("gateway_cas", []))),
                ("this host", "none" if marker is None else f"{marker.material_id} version {marker.version}"),
            ]
        )
    )
    return 0
