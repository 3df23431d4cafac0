"""The `versus-cp` console script: catch stop signals first, then load the (heavy) CLI."""

from __future__ import annotations

import sys

from versus_cp.argv import command_of

SERVICE_COMMANDS = frozenset({"router", "enrollment", "gateway", "console"})


def main() -> int:
    if command_of(sys.argv[1:]) in SERVICE_COMMANDS:
        from common.runtime import early_signals

        early_signals.install(importing=True)
    from versus_cp.main import main as cli_main

    return cli_main()
