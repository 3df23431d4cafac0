"""Load drivers from the ``versus.collector.drivers`` entry points and build the capability manifest."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from collector.drivers.base import Driver, DriverContext

GROUP = "versus.collector.drivers"


def load(ctx: DriverContext, enabled: Iterable[str] | None = None) -> dict[str, Driver]:
    """Instantiate every installed driver (or only ``enabled`` names), keyed by provider."""
    wanted = set(enabled) if enabled is not None else None
    drivers: dict[str, Driver] = {}
    for ep in entry_points(group=GROUP):
        if wanted is not None and ep.name not in wanted:
            continue
        cls = ep.load()
        driver: Driver = cls(ctx)
        drivers[driver.provider] = driver
    return drivers


def manifest(drivers: Mapping[str, Driver]) -> list[dict[str, Any]]:
    return [
        {
            "provider": d.provider,
            "max_concurrency": d.max_concurrency,
            "operations": [
                {
                    "name": name,
                    "op_class": op.op_class,
                    "timeout_s": op.timeout_s,
                    "parallel_safe": op.parallel_safe,
                    "reconcile_operation": op.reconcile_operation,
                }
                for name, op in sorted(d.operations.items())
            ],
        }
        for d in sorted(drivers.values(), key=lambda d: d.provider)
    ]


def epoch(providers: list[dict[str, Any]], previous: tuple[int, str] | None) -> tuple[int, str]:
    """A new capability epoch when the manifest changed, else the previous one."""
    digest = hashlib.sha256(json.dumps(providers, sort_keys=True).encode()).hexdigest()
    if previous is not None and previous[1] == digest:
        return previous
    return (previous[0] + 1 if previous else 1), digest
