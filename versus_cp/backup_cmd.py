"""`versus-cp backup`: take a backup of the deployment, check one, restore one onto fresh hosts.

    versus-cp backup create FILE [--material-key KEYFILE] [--json]
    versus-cp backup verify FILE [--material-key KEYFILE] [--json]
    versus-cp backup restore FILE [--material-key KEYFILE] [--json]

``create`` writes one file (mode 0600): the database as pg_dump's consistent snapshot and, when the
key material is local to this host, that material sealed under the material key. The material key
itself is never in the file: keep the key file apart from the backups (a backup and its key
together are the deployment's private keys). ``verify`` reads a backup whole, checks every
checksum and that the key opens its material. ``restore`` puts it onto an empty database
(``DATABASE_URL``, or a new embedded server in the state directory when unset) and an empty state
directory; then start the services as usual. Collectors enrolled before the backup reconnect with
the identities they hold. docs/deployment.md, "Backup and restore".
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from common.backup import service
from common.backup.archive import Manifest
from common.config.settings import Settings
from versus_cp import endpoints
from versus_cp.output import fields


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="backup_action", required=True, metavar="ACTION")
    for name, text in (
        ("create", "Write a backup of the database and the key material to FILE."),
        ("verify", "Check a backup whole: checksums, format, and that the material key opens it."),
        ("restore", "Restore a backup onto an empty database and state directory (fresh hosts)."),
    ):
        action = sub.add_parser(name, help=text, description=text)
        action.add_argument("file", type=Path, metavar="FILE")
        action.add_argument(
            "--material-key", type=Path, metavar="KEYFILE",
            help="the material key file (default: VERSUS_MATERIAL_KEY_FILE)",
        )  # fmt: skip
        action.add_argument("--json", action="store_true", help="print the result as JSON")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.material_key is not None:
        settings = settings.model_copy(update={"material_key_file": args.material_key})
    started = time.monotonic()
    if args.backup_action == "create":
        settings = endpoints.with_database(settings)
        manifest = service.create(settings, args.file)
        return _print(args, manifest, f"backup written to {args.file}", time.monotonic() - started)
    if args.backup_action == "verify":
        manifest = service.verify(settings, args.file)
        return _print(args, manifest, f"{args.file} is whole and the key opens it", None)
    if settings.database_url:
        restored = service.restore(settings, args.file, settings.database_url)
    else:
        restored = _restore_embedded(settings, args.file)
    note = f"restored {args.file} into {restored.database_url.rpartition('@')[2]}"
    if restored.migrated_from:
        note += f" (migrated from schema {restored.migrated_from})"
    return _print(args, restored.manifest, note, time.monotonic() - started)


def _restore_embedded(settings: Settings, path: Path) -> service.Restored:
    """Onto a new embedded server in the state directory, where `versus-cp up` will find it."""
    from common.embedded.postgres import EmbeddedPostgres
    from common.errors import Conflict

    directory = settings.state_dir.expanduser() / "postgres"
    if directory.exists():
        raise Conflict(
            f"{directory} exists: restore onto a fresh state directory (or set DATABASE_URL)",
            code="restore_target_not_empty",
        )
    postgres = EmbeddedPostgres(directory).start()
    try:
        return service.restore(settings, path, postgres.url)
    finally:
        postgres.stop()


def _print(args: argparse.Namespace, manifest: Manifest, note: str, seconds: float | None) -> int:
    doc = asdict(manifest)
    if seconds is not None:
        doc["seconds"] = round(seconds, 2)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(note)
    pairs = [
        ("created", manifest.created_at),
        ("schema", manifest.schema_revision),
        ("postgresql", manifest.server_major),
        ("material", f"{manifest.material_id} v{manifest.material_version} ({manifest.material_mode})"),
        ("sealed with", manifest.sealed_with or "-"),
        ("database dump", f"{manifest.members['database.dump'].size} bytes"),
    ]
    if seconds is not None:
        pairs.append(("took", f"{seconds:.1f} s"))
    print(fields(pairs))
    return 0
