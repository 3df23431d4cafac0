"""`versus-collector`: the reference collector's command line.

    versus-collector enroll --url URL --token TOKEN [--ca-pin sha256/...] [--state-dir DIR]
    versus-collector status [--state-dir DIR]

Expected failures are one line on stderr (``code: message``) and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from collector import __version__
from collector.enroll import EnrollError, EnrollOptions, enroll, status


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.environ.get("VERSUS_COLLECTOR_STATE_DIR", Path(base) / "versus-collector"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="versus-collector", description="Versus reference collector.")
    parser.add_argument("--version", action="version", version=f"versus-collector {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    e = sub.add_parser("enroll", help="Enroll with a one-time token and store the identity.")
    e.add_argument("--url", required=True, help="gateway URL, e.g. https://gw.example.net")
    e.add_argument("--token", required=True, help="enrollment token (vst_...)")
    e.add_argument("--ca-pin", help="sha256/... pin of the gateway's internal CA")
    e.add_argument("--collector-id", help="choose the collector id (default: generated)")
    e.add_argument("--force", action="store_true", help="enroll again over an existing identity")
    s = sub.add_parser("status", help="Show this collector's enrollment status.")
    for p in (e, s):
        p.add_argument("--state-dir", type=Path, default=default_state_dir())
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "enroll":
            identity = enroll(
                EnrollOptions(
                    args.url, args.token, args.state_dir, args.ca_pin, args.collector_id, args.force
                )
            )
            print(
                f"enrolled as {identity['collector_id']} in site {identity['site_id']}: {identity['status']}"
            )
            if identity["status"] == "pending":
                print("waiting for an operator to approve it; check with `versus-collector status`")
        else:
            result = status(args.state_dir)
            until = result["cert_not_after"]
            print(f"{result['collector_id']}: {result['status']} (certificate valid until {until})")
    except EnrollError as exc:
        print(f"versus-collector: error: {exc}", file=sys.stderr)
        return 1
    return 0
