"""The key sets the collector pins (``keys.json``) and how they move forward in-band.

Enrollment writes version N of the dispatch and release sets. Each later
version arrives in a claim answer as a rotation step signed by the version
before it (common/trust/key_chain.py); the collector walks the steps in order,
verifying each with the keys it holds, and saves the result atomically. A step
that does not verify is refused with its code, and the collector keeps the last
good set (and tells the control plane, through its next claim, which version it
holds).

The dispatch set is kept in one dict that the envelope, config and offer
verifiers share, so a new version applies to the next thing verified.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collector.state import read_json, write_json
from common.telemetry.logs import get_logger
from common.trust import key_chain
from common.trust.key_chain import ChainError, HeldSet
from common.trust.keys import KeyPurpose, PublicKey

log = get_logger("versus.collector.keys")


class PinnedKeys:
    """``keys.json``: the dispatch and release sets and their versions."""

    def __init__(self, path: Path):
        self.path = path
        raw = read_json(path)
        versions = raw.get("versions") or {}
        self.sets: dict[KeyPurpose, HeldSet] = {}
        for purpose in (KeyPurpose.DISPATCH, KeyPurpose.RELEASE):
            keys = {k["kid"]: PublicKey.from_json(k) for k in raw.get(purpose.value, [])}
            threshold = int((raw.get("thresholds") or {}).get(purpose.value, 1))
            self.sets[purpose] = HeldSet(purpose, int(versions.get(purpose.value, 1)), threshold, keys)
        # Shared with every verifier of things signed with the dispatch keys; updated in place.
        self.dispatch: dict[str, PublicKey] = dict(self.sets[KeyPurpose.DISPATCH].keys)

    def versions(self) -> dict[str, int]:
        return {p.value: s.version for p, s in self.sets.items()}

    def apply(self, steps: Mapping[str, Any]) -> list[ChainError]:
        """Walk the rotation steps of each set; save what verified. Returns the refusals."""
        refusals: list[ChainError] = []
        changed = False
        for purpose in (KeyPurpose.DISPATCH, KeyPurpose.RELEASE):
            chain = steps.get(purpose.value)
            if not isinstance(chain, list) or not chain:
                continue
            held = self.sets[purpose]
            reached, error = key_chain.walk(held, chain)
            if error is not None:
                log.error("key set step refused; keeping the last good set", key_set=purpose.value,
                          code=error.code, reason=str(error), held_version=reached.version)  # fmt: skip
                refusals.append(error)
            if reached.version != held.version:
                log.info("key set rotated", key_set=purpose.value, version=reached.version,
                         kids=sorted(reached.keys))  # fmt: skip
                self.sets[purpose] = reached
                changed = True
        if changed:
            self._save()
            self.dispatch.clear()
            self.dispatch.update(self.sets[KeyPurpose.DISPATCH].keys)
        return refusals

    def _save(self) -> None:
        document: dict[str, Any] = {
            "versions": self.versions(),
            "thresholds": {p.value: s.threshold for p, s in self.sets.items()},
        }
        for purpose, held in self.sets.items():
            document[purpose.value] = [k.to_json() for k in held.keys.values()]
        write_json(self.path, document)
