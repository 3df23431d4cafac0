"""Whether a process id names a running process (stdlib only: the collector uses it too)."""

from __future__ import annotations

import os


def running(pid: object) -> bool:
    """True when ``pid`` is a positive int naming a process that exists (someone else's counts)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True
