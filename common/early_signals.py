"""SIGTERM and SIGINT caught from the first instant of a service process, before asyncio runs.

A service takes a second or more to import and start; without this, a stop
signal in that window kills the process (exit -15) instead of stopping it.
Installed by the `versus-cp` entry point for service commands only (never on
import: a test process importing the CLI keeps its own signal handling). The
event loop's handlers (common/runtime.py) take over later and read what was
recorded here. Deliberately free of heavy imports.
"""

from __future__ import annotations

import signal
from types import FrameType

_requested: str | None = None


def _record(signum: int, _frame: FrameType | None) -> None:
    global _requested
    if _requested is None:
        _requested = signal.Signals(signum).name


def install() -> None:
    """Record SIGTERM and SIGINT instead of dying of them."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _record)


def requested() -> str | None:
    """The name of the first stop signal received so far, if any."""
    return _requested
