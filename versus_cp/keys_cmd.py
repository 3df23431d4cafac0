"""`versus-cp keys`: list, rotate and retire the dispatch and release key sets; see who holds which.

    versus-cp keys list [--set dispatch|release] [--json]
    versus-cp keys rotate --set dispatch|release [--lifetime-days N] [--grace 1h]
    versus-cp keys retire --set dispatch|release KID
    versus-cp keys status [--json]

A rotation publishes a new version of the set with a new key, signed by the
keys of the version before (common/trust/key_chain.py); collectors receive it with
their next claim and walk every version they missed. The new key verifies at
once but signs only after ``--grace`` (default 1h), when connected collectors
hold it. ``retire`` publishes a version without an old key. ``status`` shows
the versions and, from the running control plane, which version each
collector holds. Procedure and failure modes: docs/day2.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from versus.fleet.v1 import fleet_pb2

from common.config.settings import KeyMaterialMode, Settings
from common.db import engine as db_engine
from common.errors import ConfigError
from common.trust.keys import DEFAULT_LIFETIME, KeyPurpose, KeySet, rfc3339
from common.trust.keystore import KeyStore
from common.updates.repo_sync import SharedDirectory
from router.releases.update_repo import UpdateRepository
from router.releases.update_share import SharedUpdateRepository
from versus_cp import material_cmd, rpc
from versus_cp.fleet_cmd import span

MAX_LIFETIME_DAYS = 3 * 365


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="Show the keys of each set (public parts only).")
    listing.add_argument("--set", choices=[p.value for p in KeyPurpose], dest="key_set")
    listing.add_argument("--json", action="store_true", help="Print the published public key sets as JSON.")
    rotate = sub.add_parser("rotate", help="Publish a new version of a set with a new key.")
    rotate.add_argument("--set", choices=[p.value for p in KeyPurpose], dest="key_set", required=True)
    rotate.add_argument(
        "--lifetime-days",
        type=int,
        default=DEFAULT_LIFETIME.days,
        help=f"Validity of the new key (default {DEFAULT_LIFETIME.days}, max {MAX_LIFETIME_DAYS}).",
    )
    rotate.add_argument(
        "--grace",
        type=span,
        default=dt.timedelta(hours=1),
        metavar="SPAN",
        help="How long the new key only verifies before it signs (default 1h; 0s signs at once).",
    )
    retire = sub.add_parser("retire", help="Publish a new version of a set without an old key.")
    retire.add_argument("--set", choices=[p.value for p in KeyPurpose], dest="key_set", required=True)
    retire.add_argument("kid")
    status = sub.add_parser("status", help="Versions of each set and which version each collector holds.")
    status.add_argument("--json", action="store_true")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.keys_action in ("rotate", "retire"):
        # In shared mode the change becomes the next version every replica follows.
        with material_cmd.editing(settings) as state:
            return _change(settings, state, args)
    return _read(settings, material_cmd.current_state(settings), args)


def _change(settings: Settings, state: Path, args: argparse.Namespace) -> int:
    key_set = getattr(args, "key_set", None)
    purposes = [KeyPurpose(key_set)] if key_set else list(KeyPurpose)
    now = int(time.time())
    if args.keys_action == "rotate":
        if not 1 <= args.lifetime_days <= MAX_LIFETIME_DAYS:
            raise ConfigError(f"--lifetime-days must be between 1 and {MAX_LIFETIME_DAYS}")
        store = KeyStore(state, purposes[0])
        grace = int(args.grace.total_seconds())
        before = {k.kid for k in store.load_or_create(now).keys}
        keyset = store.rotate(now, dt.timedelta(days=args.lifetime_days), grace_s=grace)
        _follow_release_keys(settings, state, keyset)
        [new] = [k for k in keyset.keys if k.kid not in before]
        when = "signs now" if grace <= 0 else f"signs from {rfc3339(now + grace)}"
        print(f"{keyset.purpose.value}: version {keyset.version}, new key {new.kid} "
              f"({when}, valid until {rfc3339(new.not_after)})")  # fmt: skip
        return 0
    if args.keys_action == "retire":
        keyset = KeyStore(state, purposes[0]).retire(args.kid, now)
        _follow_release_keys(settings, state, keyset)
        print(f"{keyset.purpose.value}: version {keyset.version} without {args.kid}")
        return 0
    raise AssertionError(args.keys_action)


def _read(settings: Settings, state: Path, args: argparse.Namespace) -> int:
    key_set = getattr(args, "key_set", None)
    purposes = [KeyPurpose(key_set)] if key_set else list(KeyPurpose)
    now = int(time.time())
    if args.keys_action == "status":
        return _status(settings, state, now, args.json)
    published = {}
    for purpose in purposes:
        store = KeyStore(state, purpose)
        keyset = store.load_or_create(now)
        waiting = store.waiting_kid()
        published[purpose.value] = [k.to_json() for k in keyset.public_keys(now)]
        if not args.json:
            for key in keyset.public_keys(now):
                marker = "current" if key.kid == keyset.current_kid else "verifying"
                marker = "waiting" if key.kid == waiting and marker != "current" else marker
                print(f"{purpose.value:9} {key.kid:24} {marker:9} until {rfc3339(key.not_after)}")
    if args.json:
        print(json.dumps(published, indent=2))
    return 0


def _follow_release_keys(settings: Settings, state: Path, keyset: KeySet) -> None:
    """The release keys hold the update repository's root (router/releases/update_repo.py): every change of
    the set is a new root version at once, so each is signed by a key of the one before. With
    replicas on several hosts the repository is the one shared through PostgreSQL."""
    if keyset.purpose is not KeyPurpose.RELEASE:
        return
    now = dt.datetime.now(dt.UTC)
    if settings.key_material is not KeyMaterialMode.SHARED or not settings.database_url:
        UpdateRepository(state / "updates").ensure(keyset, now)
        return
    engine = db_engine.create_sync(settings.database_url, pool_size=1)
    try:
        SharedUpdateRepository(SharedDirectory(state / "updates", engine)).ensure(keyset, now)
    finally:
        engine.dispose()


def _status(settings: Settings, state: Path, now: int, as_json: bool) -> int:
    """Each set's version and keys, and (from the router) how many collectors hold each version."""
    sets: dict[str, Any] = {}
    for purpose in KeyPurpose:
        store = KeyStore(state, purpose)
        keyset = store.load_or_create(now)
        waiting = store.pending_activation()
        sets[purpose.value] = {
            "version": keyset.version,
            "current": keyset.current_kid,
            "waiting": None if waiting is None else {"activates_at": rfc3339(waiting)},
            "keys": [k.public.to_json() for k in keyset.keys],
            "held_by": {},
        }
    for c in rpc.all_collectors(settings):
        if c.status in (fleet_pb2.COLLECTOR_STATUS_REVOKED, fleet_pb2.COLLECTOR_STATUS_DENIED):
            continue
        for name, entry in sets.items():
            held = c.session.key_versions.get(name)
            label = str(held) if held else "unknown"
            entry["held_by"].setdefault(label, []).append(c.collector_id)
    if as_json:
        print(json.dumps(sets, indent=2))
        return 0
    for name, entry in sets.items():
        waiting = entry["waiting"]
        print(f"{name}: version {entry['version']}, current {entry['current']}"
              + (f", a new key signs from {waiting['activates_at']}" if waiting else ""))  # fmt: skip
        for label, ids in sorted(entry["held_by"].items()):
            who = "collectors holding version " + label if label != "unknown" else "collectors not heard from"
            print(f"  {len(ids):5}  {who}: {', '.join(sorted(ids)[:5])}{' ...' if len(ids) > 5 else ''}")
    return 0
