"""`versus-collector credentials`: the operator's hands on the sealed credentials (vault mode A).

    versus-collector credentials set PROVIDER TARGET [--file PATH]   # the value: a JSON object,
                                                                     # from stdin or the file
    versus-collector credentials rm PROVIDER TARGET
    versus-collector credentials list

Values never come from the command line (``ps`` and shell history would see them) and are never
printed: ``list`` shows providers, devices and field names only. Each change rewrites
``credentials.sealed`` atomically; a running collector uses it from its next task on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from collector.credentials import migrate_plaintext, read_sealed, write_sealed
from collector.sealed import SealedError
from collector.state import StatePaths, load_key


class CredentialsError(Exception):
    """A one-line failure for the command line."""


def add_arguments(parser: argparse.ArgumentParser, state_dir: Path) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser(
        "set", help="Add or replace a device's credential (a JSON object from stdin or --file)."
    )
    s.add_argument("provider")
    s.add_argument("target")
    s.add_argument("--file", type=Path, help="read the JSON object from this file instead of stdin")
    r = sub.add_parser("rm", help="Remove a device's credential.")
    r.add_argument("provider")
    r.add_argument("target")
    sub.add_parser("list", help="Providers, devices and field names (never values).")
    for p in sub.choices.values():
        p.add_argument("--state-dir", type=Path, default=state_dir)


def _value(args: argparse.Namespace) -> dict[str, Any]:
    raw = args.file.read_text() if args.file else sys.stdin.read()
    try:
        value = json.loads(raw)
    except ValueError:
        raise CredentialsError(
            'the credential must be a JSON object, e.g. {"username": ..., "password": ...}'
        ) from None
    if not isinstance(value, dict) or not value:
        raise CredentialsError("the credential must be a non-empty JSON object")
    return value


def run(args: argparse.Namespace) -> int:
    paths = StatePaths(args.state_dir)
    if not paths.key.exists():
        raise CredentialsError(f"no identity in {args.state_dir}; run `versus-collector enroll` first")
    identity = load_key(paths.key)
    try:
        migrate_plaintext(args.state_dir, identity)
        current = read_sealed(args.state_dir, identity)
    except SealedError as exc:
        raise CredentialsError(f"{exc.code}: {exc}") from None
    if args.action == "list":
        for provider, devices in sorted(current.items()):
            for target, fields in sorted(devices.items()):
                names = ", ".join(sorted(fields)) if isinstance(fields, dict) else "?"
                print(f"{provider}\t{target}\t{names}")
        return 0
    devices = dict(current.get(args.provider, {}))
    if args.action == "set":
        devices[args.target] = _value(args)
        verb = "set"
    else:
        if args.target not in devices:
            raise CredentialsError(f"no {args.provider} credential for {args.target!r}")
        del devices[args.target]
        verb = "removed"
    updated = {**current, args.provider: devices}
    if not devices:
        del updated[args.provider]
    write_sealed(args.state_dir, identity, updated)
    print(f"{args.provider} credential for {args.target} {verb}")
    return 0
