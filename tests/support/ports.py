"""Port ranges of parallel test workers, claimed under a lock so that no two pytest processes on
this machine ever pick ports from the same range.

Workers of one pytest-xdist session used to take the range of their worker number (gw1: the
second one). `make test` runs two xdist sessions at once (unit and integration tests beside the
end-to-end suite), whose gw1 workers then picked the same ports and bound each other's: a
control plane failed to start with "address already in use". Each worker now claims the first
range nobody holds, by a non-blocking ``flock`` on a file named after it, held until the worker
exits (the kernel releases it however the process ends).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

LOCKS = Path(tempfile.gettempdir()) / "versus-test-ports"
START, EACH = 20000, 1500
_held: list[int] = []  # the claimed ranges' lock files, open for the life of this process


def claim_range(ephemeral_low: int, locks: Path = LOCKS) -> tuple[int, int] | None:
    """The first free range ``[low, high]`` below the kernel's ephemeral ports, now this process's
    alone; None when every range is taken (the caller then asks the kernel for ports)."""
    locks.mkdir(exist_ok=True)
    low = START
    while low + EACH <= ephemeral_low:
        fd = os.open(locks / f"{low}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            low += EACH
            continue
        _held.append(fd)
        return low, low + EACH - 1
    return None
