"""The `versus-cp` console script: catch stop signals first, then load the (heavy) CLI."""

from __future__ import annotations

import sys
from collections.abc import Sequence

SERVICE_COMMANDS = frozenset({"router", "enrollment", "gateway", "console"})


def command_of(argv: Sequence[str]) -> str:
    """The subcommand named in ``argv`` (skipping ``--config FILE`` and other options)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--config":
            skip = True
        elif not arg.startswith("-"):
            return arg
    return ""


def main() -> int:
    if command_of(sys.argv[1:]) in SERVICE_COMMANDS:
        from common import early_signals

        early_signals.install(importing=True)
    from versus_cp.main import main as cli_main

    return cli_main()
