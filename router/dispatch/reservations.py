"""Slots this router process is filling right now, so its concurrent placements spread out.

Placement reads collectors' loads from Redis, which learns of a new dispatch only after
its transaction commits. Until then every other placement in the process sees the same
slot free, picks the same collector, and finds it full only after locking it in
PostgreSQL (a statement, a wait or a skip, and another try). With many submits at once
most of their statements went to that contest. A placement therefore holds the slot
it is about to try here, from its pick until Redis counts the dispatch (or the try
failed), and every placement adds the held slots to the loads it reads.

This is advice, like the Redis counts: PostgreSQL's lock and count under it stay the
authority, and replicas still contest slots through them. A hold that is never released
(its transaction raised) lapses after :data:`HOLD_S`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping

# A hold older than this is ignored and dropped: its placement ended without releasing it.
HOLD_S = 2.0


class Reservations:
    """Held slots per (collector, provider); pure bookkeeping, no I/O."""

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic):
        self._hold_s = hold_s
        self._clock = clock
        self._ids = itertools.count()
        # provider -> collector -> {hold id: expiry}
        self._held: dict[str, dict[str, dict[int, float]]] = {}

    def hold(self, collector_id: str, provider: str) -> Callable[[], None]:
        """Hold one slot; returns the release (calling it twice is harmless)."""
        hold_id = next(self._ids)
        per_collector = self._held.setdefault(provider, {})
        per_collector.setdefault(collector_id, {})[hold_id] = self._clock() + self._hold_s

        def release() -> None:
            holds = per_collector.get(collector_id)
            if holds is not None:
                holds.pop(hold_id, None)
                if not holds:
                    per_collector.pop(collector_id, None)

        return release

    def held(self, provider: str) -> Mapping[str, int]:
        """Live holds per collector for ``provider`` (lapsed ones are dropped here)."""
        per_collector = self._held.get(provider)
        if not per_collector:
            return {}
        now = self._clock()
        out: dict[str, int] = {}
        for collector_id in list(per_collector):
            holds = per_collector[collector_id]
            for hold_id in [h for h, expiry in holds.items() if expiry <= now]:
                del holds[hold_id]
            if holds:
                out[collector_id] = len(holds)
            else:
                del per_collector[collector_id]
        return out
