"""The rotation chains of the dispatch and release key sets, as the router hands them to collectors.

A claim names the versions of the two sets the collector holds
(``key_versions``); when the store has newer ones, the claim is answered at
once with the steps from the collector's version to the newest
(common/trust/key_chain.py) and no work, so a collector back from a long absence
walks every rotation it missed before anything else. Steps are immutable
files: they are read once and cached.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.trust import key_chain
from common.trust.keys import KeyPurpose
from common.trust.keystore import KeyStore

PURPOSES = (KeyPurpose.DISPATCH, KeyPurpose.RELEASE)


class KeyChains:
    """Read-only view of ``<state>/keys/<purpose>/chain`` (written by ``versus-cp keys``)."""

    def __init__(self, state_dir: Path, check_interval_s: float = 1.0):
        self._stores = {p: KeyStore(state_dir, p) for p in PURPOSES}
        self._steps: dict[tuple[KeyPurpose, int], dict[str, Any]] = {}
        self._check_interval_s = check_interval_s
        # Per set: (when last checked, the index's mtime then, the version then). Every claim asks;
        # the index is read again only when its mtime changed, and stat'ed at most once a second.
        self._newest: dict[KeyPurpose, tuple[float, int, int]] = {}

    def newest(self, purpose: KeyPurpose) -> int:
        now = time.monotonic()
        cached = self._newest.get(purpose)
        if cached is not None and now - cached[0] < self._check_interval_s:
            return cached[2]
        store = self._stores[purpose]
        mtime = store.mtime_ns()
        if cached is not None and cached[1] == mtime:
            version = cached[2]
        else:
            version = store.version() if store.exists() else 1
        self._newest[purpose] = (now, mtime, version)
        return version

    def behind(self, held: Mapping[str, int]) -> dict[str, list[dict[str, Any]]]:
        """For each set the collector holds an older version of, the steps to the newest."""
        out: dict[str, list[dict[str, Any]]] = {}
        for purpose in PURPOSES:
            have = max(int(held.get(purpose.value, 1) or 1), 1)
            newest = self.newest(purpose)
            if have < newest:
                out[purpose.value] = [self._step(purpose, v) for v in range(have + 1, newest + 1)]
        return out

    def kids(self, purpose: KeyPurpose, version: int) -> list[str] | None:
        """The kids of ``version`` (None for version 1, which enrollment recorded itself)."""
        if version < 2 or version > self.newest(purpose):
            return None
        return key_chain.step_kids(self._step(purpose, version))

    def _step(self, purpose: KeyPurpose, version: int) -> dict[str, Any]:
        cached = self._steps.get((purpose, version))
        if cached is None:
            path = self._stores[purpose].directory / "chain" / f"{version}.json"
            cached = self._steps[(purpose, version)] = json.loads(path.read_text())
        return cached
