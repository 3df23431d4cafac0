"""An attacker's wire between python-tuf's client and an update repository on disk (tests only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tuf.api import exceptions
from tuf.ngclient.fetcher import FetcherInterface

BASE = "https://gw.test/api/collector/v1/updates/"


class Wire(FetcherInterface):
    """Serves the repository's files under :data:`BASE`; ``replace`` makes a path answer other
    bytes, ``stall`` makes it stall (as a server that stops sending)."""

    def __init__(self, root: Path):
        self.root = root
        self.replace: dict[str, bytes] = {}
        self.stall: set[str] = set()

    def _fetch(self, url: str) -> Iterator[bytes]:
        relative = url.removeprefix(BASE)
        if relative in self.stall:
            raise exceptions.SlowRetrievalError(f"{relative}: the download stalled")
        if relative in self.replace:
            return iter([self.replace[relative]])
        path = self.root / relative
        if not path.is_file():
            raise exceptions.DownloadHTTPError(f"{relative} not found", 404)
        return iter([path.read_bytes()])
