"""The state directory: where keys, CAs, TLS files and embedded server data live."""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from common.errors import ConfigError, StartupError


def ensure_writable(path: Path) -> Path:
    """Create ``path`` (mode 0700) if needed and prove it is writable, or raise :class:`ConfigError`."""
    path = path.expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"state directory {path} is not writable: {reason}") from None
    return path.resolve()


class StateLock:
    """An exclusive lock on a state directory so two `up` processes cannot share it."""

    def __init__(self, state_dir: Path):
        self.path = state_dir / "versus-cp.lock"
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        fh = open(self.path, "a+")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StartupError(f"state directory {self.path.parent} is in use by pid {holder}") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex), read 1 MiB at a time (artifacts run to 256 MiB)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_private(path: Path, data: bytes) -> None:
    """Atomically write a file readable only by its owner (keys, passwords)."""
    _write_atomic(path, data, 0o600)


def write_public(path: Path, data: bytes) -> None:
    """Atomically write a non-secret file (certificates)."""
    _write_atomic(path, data, 0o644)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    # The mode is set before any byte is written, and readers see either the old
    # file or the complete new one.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (its ``.lock`` file), created 0700 if needed, so
    writers in several processes (services, the CLI) take turns."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
