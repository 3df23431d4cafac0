"""A file read again whenever it changes: credentials and tokens rotate without a restart.

``WatchedFile.get()`` stats the file on every call (one system call, no read)
and parses it again only when its identity changed: inode, size or
modification time. Writers replace such files atomically (write a temporary
file, then rename), so a reader sees the old content or the new, never half of
one. A file that changed but does not parse (say, an editor saved it half-way,
in place) keeps the last good value and logs once per change; a file that
disappeared is ``missing``, which the caller decides how to treat.

The parsed value is returned as a whole: a caller takes one snapshot at the
start of a unit of work (a task, a call) and keeps it, so work in flight is
never switched to another credential half-way.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _log() -> Any:
    """The logger, imported when a file changes: the operator CLI reads its token through this
    module once and exits, and importing structlog would be a fifth of its start-up."""
    from common.telemetry.logs import get_logger

    return get_logger("versus.watched_file")


class FileRefused(ValueError):
    """The file exists but must not be used (say, readable by others); the message says why.

    Like a parse error: refused at the first read, and after a change the last good value stays.
    """


def private_only(path: Path, st: os.stat_result) -> None:
    """A ``check`` for secret files: refuse one that group or others can read (as ssh refuses a key)."""
    mode = st.st_mode & 0o777
    if mode & 0o077:
        raise FileRefused(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")


@dataclass(frozen=True, slots=True)
class _Stamp:
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def _stamp(st: os.stat_result) -> _Stamp:
    return _Stamp(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class WatchedFile(Generic[T]):
    """The parsed content of ``path``, re-parsed after every change (see the module docstring).

    ``parse`` turns the file's bytes into a value or raises ``ValueError`` /
    :class:`FileRefused`; ``missing`` is the value while the file does not exist;
    ``check`` runs on the stat result first (for example, to refuse loose permissions).
    """

    def __init__(
        self,
        path: Path,
        parse: Callable[[bytes], T],
        missing: T,
        check: Callable[[Path, os.stat_result], None] | None = None,
    ):
        self.path = path
        self._parse = parse
        self._missing = missing
        self._check = check
        self._stamp: _Stamp | None = None
        self._value: T = missing
        self._loaded = False
        self._lock = threading.Lock()  # token sources are read from gRPC's threads too
        self.reloads = 0

    def get(self) -> T:
        """The current value: re-read if the file changed since the last call."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            with self._lock:
                if self._stamp is not None:
                    _log().info("watched file removed", path=str(self.path))
                self._stamp, self._value, self._loaded = None, self._missing, True
                return self._value
        stamp = _stamp(st)
        with self._lock:
            if self._loaded and stamp == self._stamp:
                return self._value
            try:
                if self._check is not None:
                    self._check(self.path, st)
                value = self._parse(self.path.read_bytes())
            except (ValueError, OSError) as exc:
                if not self._loaded:
                    raise
                if stamp != self._stamp:
                    _log().error(
                        "watched file changed but cannot be used; keeping the last good content",
                        path=str(self.path),
                        error=str(exc)[:200],
                    )
                self._stamp = stamp  # log once per change, not once per read
                return self._value
            if self._loaded:
                _log().info("watched file reloaded", path=str(self.path))
                self.reloads += 1
            self._stamp, self._value, self._loaded = stamp, value, True
            return value
