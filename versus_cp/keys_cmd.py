"""`versus-cp keys`: list and rotate the dispatch and release key sets in the state directory.

    versus-cp keys list [--set dispatch|release] [--json]
    versus-cp keys rotate --set dispatch|release [--lifetime-days N]

Rotation adds a key and makes it current; older keys keep verifying until
their not_after, so collectors holding the previous public set keep working.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time

from common.errors import ConfigError
from common.keys import DEFAULT_LIFETIME, KeyPurpose, rfc3339
from common.keystore import KeyStore
from common.settings import Settings
from common.state_dir import ensure_writable

MAX_LIFETIME_DAYS = 3 * 365


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="Show the keys of each set (public parts only).")
    listing.add_argument("--set", choices=[p.value for p in KeyPurpose], dest="key_set")
    listing.add_argument("--json", action="store_true", help="Print the published public key sets as JSON.")
    rotate = sub.add_parser("rotate", help="Add a new current key to a set.")
    rotate.add_argument("--set", choices=[p.value for p in KeyPurpose], dest="key_set", required=True)
    rotate.add_argument(
        "--lifetime-days",
        type=int,
        default=DEFAULT_LIFETIME.days,
        help=f"Validity of the new key (default {DEFAULT_LIFETIME.days}, max {MAX_LIFETIME_DAYS}).",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    state = ensure_writable(settings.state_dir)
    purposes = [KeyPurpose(args.key_set)] if args.key_set else list(KeyPurpose)
    now = int(time.time())
    if args.keys_action == "rotate":
        if not 1 <= args.lifetime_days <= MAX_LIFETIME_DAYS:
            raise ConfigError(f"--lifetime-days must be between 1 and {MAX_LIFETIME_DAYS}")
        keyset = KeyStore(state, purposes[0]).rotate(now, dt.timedelta(days=args.lifetime_days))
        current = keyset.current
        until = rfc3339(current.not_after)
        print(f"{keyset.purpose.value}: new current key {current.kid} (valid until {until})")
        return 0
    published = {}
    for purpose in purposes:
        keyset = KeyStore(state, purpose).load_or_create(now)
        published[purpose.value] = [k.to_json() for k in keyset.public_keys(now)]
        if not args.json:
            for key in keyset.public_keys(now):
                marker = "current" if key.kid == keyset.current_kid else "verifying"
                print(f"{purpose.value:9} {key.kid:24} {marker:9} until {rfc3339(key.not_after)}")
    if args.json:
        print(json.dumps(published, indent=2))
    return 0
