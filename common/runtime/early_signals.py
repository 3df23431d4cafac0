"""SIGTERM and SIGINT caught from the first instant of a service process, before asyncio runs.

A service takes a second or more to import and start; without this, a stop
signal in that window kills the process (exit -15) instead of stopping it.
Installed by the `versus-cp` entry point for service commands only (never on
import: a test process importing the CLI keeps its own signal handling). The
event loop's handlers (common/runtime/service.py) take over later and read what was
recorded here. Deliberately free of heavy imports.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

_requested: str | None = None
# True while the service's modules are being imported: nothing has been opened, written or
# started yet, so a stop signal then ends the process at once (importing can take seconds on a
# loaded machine, and the stop must not wait for it).
_importing = False


def _record(signum: int, _frame: FrameType | None) -> None:
    global _requested
    if _importing:
        os._exit(0)
    if _requested is None:
        _requested = signal.Signals(signum).name


def install(importing: bool = False) -> None:
    """Record SIGTERM and SIGINT instead of dying of them; with ``importing``, exit 0 on one
    until :func:`imported` says the service's code is loaded."""
    global _importing
    _importing = importing
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _record)


def imported() -> None:
    """The service's modules are loaded: from now on a stop signal is recorded, not obeyed."""
    global _importing
    _importing = False


def requested() -> str | None:
    """The name of the first stop signal received so far, if any."""
    return _requested
