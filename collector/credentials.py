"""Device credentials in vault mode A: ``<state>/credentials.json``, re-read whenever it changes.

An operator edits the file in place of a restart: replace it atomically (write
a temporary file in the same directory, mode 0600, then rename it over the
old one) and the next task sees the new content. A credential removed from the
file is unusable from the next task on; a task already running keeps the
snapshot it started with. A replacement that is not a JSON object, or that is
readable by others, is refused: the collector logs it and keeps the last good
content. At start, a missing file means no credentials; a bad one is an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.watched_file import WatchedFile, private_only

FILE_NAME = "credentials.json"

Credentials = Mapping[str, Any]
NONE: Credentials = {}


def _parse(raw: bytes) -> Credentials:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("credentials.json must hold a JSON object")
    return value


class LocalCredentials:
    """The current content of ``credentials.json``; call it to take a snapshot."""

    def __init__(self, state_dir: Path):
        self._file: WatchedFile[Credentials] = WatchedFile(state_dir / FILE_NAME, _parse, NONE, private_only)
        self._file.get()  # a bad file at start is an error the operator sees at once

    def __repr__(self) -> str:  # the content is secret
        return f"LocalCredentials({str(self._file.path)!r})"

    def __call__(self) -> Credentials:
        return self._file.get()

    @property
    def reloads(self) -> int:
        return self._file.reloads


def no_credentials() -> Credentials:
    """What drivers see in vault modes B and C, where the local file is not read."""
    return NONE
