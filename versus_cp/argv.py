"""Which subcommand a `versus-cp` command line names, read before anything heavy is imported
(the entry point catches stop signals first for services; the CLI imports one command's module)."""

from __future__ import annotations

from collections.abc import Sequence


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
