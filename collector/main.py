"""`versus-collector`: the reference collector's command line.

The subcommands are placeholders for the enrollment, claim-loop and supervisor
work that lands in their own issues; until then they exit with status 2 and
say so rather than pretending to work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collector import __version__

_PLANNED = {
    "enroll": "Enroll with a one-time token and store the identity in the state directory.",
    "run": "Claim, verify and execute tasks, and report results.",
    "supervise": "Run the collector under a supervisor that applies signed upgrades.",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="versus-collector", description="Versus reference collector.")
    parser.add_argument("--version", action="version", version=f"versus-collector {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in _PLANNED.items():
        sub.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(f"versus-collector: error: `{args.command}` is not available in this build yet", file=sys.stderr)
    return 2
