"""Order a suite's tests so that pytest-xdist's work-stealing scheduler ends its workers together.

``--dist worksteal`` hands each of N workers a contiguous slice of the collected order, sized by
count (the first ``len // N``, the next ``rest // (N-1)``, ...), and when a worker runs dry it takes
half of the longest remaining queue *from its end*. In file order the end-to-end suite's
two-minute tests pile into one slice and the run ends with one worker busy and two idle (about
70 s of a 12-minute run). Here the slices are filled longest-first by their recorded durations
(greedy longest-processing-time), each slice longest-first so that what is stolen from its end is
short. A module whose tests share a fixture wider than one test (a module-scoped control plane)
stays together: interleaved, pytest would start that fixture again for every run of its tests.

The durations are a plain JSON file of node id -> seconds, refreshed with ``make e2e-durations``;
a test it does not know weighs the median. Nothing here changes which tests run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

WIDE_SCOPES = frozenset({"module", "package", "class"})


@dataclass
class Unit:
    """Tests that must run in a row on one worker (one test, or one module sharing a fixture)."""

    items: list[pytest.Item]
    weight: float


@dataclass
class Slice:
    """What one worker is handed first: a capacity in tests and what it holds so far."""

    capacity: int
    units: list[Unit] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(u.items) for u in self.units)

    @property
    def weight(self) -> float:
        return sum(u.weight for u in self.units)


def slice_sizes(total: int, workers: int) -> list[int]:
    """How many tests worksteal hands each worker at the start (its arithmetic, in its order)."""
    sizes = []
    for i in range(workers):
        size = total // (workers - i)
        sizes.append(size)
        total -= size
    return sizes


def _binds_module(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in WIDE_SCOPES for defs in info.name2fixturedefs.values() for d in defs)


def units_of(items: Sequence[pytest.Item], durations: Mapping[str, float]) -> list[Unit]:
    """The items as schedulable units, weighted by their recorded durations."""
    default = statistics.median(durations.values()) if durations else 1.0
    bound = {
        item.module.__name__ for item in items if isinstance(item, pytest.Function) and _binds_module(item)
    }
    units: list[Unit] = []
    by_module: dict[str, Unit] = {}
    for item in items:
        weight = durations.get(item.nodeid, default)
        module = item.module.__name__ if isinstance(item, pytest.Function) else None
        if module is not None and module in bound:
            unit = by_module.get(module)
            if unit is None:
                unit = by_module[module] = Unit([], 0.0)
                units.append(unit)
            unit.items.append(item)
            unit.weight += weight
        else:
            units.append(Unit([item], weight))
    return units


def balanced(units: list[Unit], workers: int) -> list[pytest.Item]:
    """The items in an order whose worksteal slices carry about equal recorded time."""
    total = sum(len(u.items) for u in units)
    slices = [Slice(size) for size in slice_sizes(total, workers)]
    for unit in sorted(units, key=lambda u: u.weight, reverse=True):
        room = [s for s in slices if s.capacity - s.count >= len(unit.items)]
        # A unit no slice has room for goes where most room is left (the counts then differ from
        # worksteal's by a few tests, which only shifts where its slices begin).
        target = (
            min(room, key=lambda s: s.weight) if room else max(slices, key=lambda s: s.capacity - s.count)
        )
        target.units.append(unit)
    return [item for s in slices for unit in s.units for item in unit.items]


def load_durations(path: Path) -> dict[str, float]:
    """The recorded durations, or none when the file is missing."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}
