"""Placement: which collector runs a task. Pure code, fed values in tests.

1. **Eligibility** - a collector is a candidate when it is active, not draining,
   live (claimed within the liveness window), serves the task's site and tenant,
   advertises the provider and operation at the task's op_class, has spare
   capacity for that provider (in_flight < max_concurrency), reports FIPS
   when the task requires it, and has settled a protocol version at or above
   the floor of every feature the task needs (common/protocol.py; a floor is a
   placement rule: older collectors keep running everything else).
2. **Pick** - deterministic: the lowest load (in_flight / max_concurrency) wins,
   so work spreads across collectors; equal loads go to the highest rendezvous
   hash of (target_ref, collector_id), so a device keeps landing on the same
   collector while loads are level; the collector id breaks any remaining tie.
3. **Class check** - when no collector is eligible but some advertise the
   operation under another class, the request is refused: a module cannot call
   a terminal mutation ``read`` to skip the device lease.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from common.envelope.canonical import OpClass
from common.errors import FailedPrecondition
from common.protocol import features_floor, floor_condition, floor_of

# A collector in vault mode B takes work only at the version that relays credentials.
RELAY_FLOOR = floor_of("relayed_credentials")

DEFAULT_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class OperationCap:
    op_class: str
    parallel_safe: bool = False
    reconcile_operation: str = ""
    # The driver's own bound on one run; a mutation's envelope is valid for about this long.
    timeout_s: int = DEFAULT_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class ProviderCap:
    max_concurrency: int
    operations: Mapping[str, OperationCap]


@dataclass(frozen=True, slots=True)
class Candidate:
    collector_id: str
    site_id: str
    tenant_id: str
    active: bool
    draining: bool
    live: bool
    fips: bool
    providers: Mapping[str, ProviderCap]
    in_flight: Mapping[str, int] = field(default_factory=dict)
    # The dispatch key ids the collector was given (None: enrolled before they were recorded).
    dispatch_kids: frozenset[str] | None = None
    # The protocol version settled on the collector's last claim (1 when it never said).
    protocol: int = 1
    # Vault mode B: its credentials are relayed with each dispatch (a feature with a floor).
    relayed: bool = False

    def load(self, provider: str) -> float:
        cap = self.providers[provider].max_concurrency
        return self.in_flight.get(provider, 0) / cap if cap else 1.0


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    provider: str
    operation: str
    op_class: str
    site_id: str
    tenant_id: str
    target_ref: str
    requires_fips: bool = False
    # Collector features the task needs; each has a protocol floor (common/protocol.py).
    features: tuple[str, ...] = ()

    @property
    def floor(self) -> int:
        """The lowest protocol version a collector must have settled to run the task."""
        return features_floor(self.features)[0]


class OpClassMismatch(FailedPrecondition):
    default_code = "op_class_mismatch"


def _advertised(c: Candidate, req: PlacementRequest) -> OperationCap | None:
    provider = c.providers.get(req.provider)
    return provider.operations.get(req.operation) if provider else None


def eligible(req: PlacementRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Every candidate that may run the request now; raises :class:`OpClassMismatch` (see module doc)."""
    chosen: list[Candidate] = []
    mismatched: set[str] = set()
    floor = req.floor
    for c in candidates:
        if not (c.active and c.site_id == req.site_id and c.tenant_id == req.tenant_id):
            continue
        op = _advertised(c, req)
        if op is None:
            continue
        if op.op_class != req.op_class:
            # Judged on every manifest of the site, live or not: a lie must not slip through
            # while the collectors that would expose it are briefly silent (after a Redis loss).
            mismatched.add(op.op_class)
            continue
        if c.draining or not c.live or (req.requires_fips and not c.fips):
            continue
        if c.protocol < (max(floor, RELAY_FLOOR) if c.relayed else floor):
            continue
        if c.in_flight.get(req.provider, 0) >= c.providers[req.provider].max_concurrency:
            continue
        chosen.append(c)
    if not chosen and mismatched:
        raise OpClassMismatch(
            f"{req.provider}/{req.operation} is declared {', '.join(sorted(mismatched))} by the driver, "
            f"not {req.op_class}"
        )
    return chosen


def shortfall(req: PlacementRequest, candidates: Sequence[Candidate]) -> str | None:
    """The condition to show when the only thing keeping the task from a collector is its protocol:
    ``needs protocol ≥ N for <feature>`` (None when some candidate reaches the floor, or when no
    candidate would take it even at the floor)."""
    below: set[tuple[str, ...]] = set()
    at_floor = False
    for c in candidates:
        if c.active and c.live and c.site_id == req.site_id and c.tenant_id == req.tenant_id:
            op = _advertised(c, req)
            if op is not None and op.op_class == req.op_class:
                # A collector in vault mode B needs the relay's floor for any work.
                needs = (*req.features, "relayed_credentials") if c.relayed else req.features
                if c.protocol >= features_floor(needs)[0]:
                    at_floor = True
                else:
                    below.add(needs)
    if at_floor or not below:
        return None
    return floor_condition(min(below, key=lambda needs: features_floor(needs)[0]))


def _rendezvous(target_ref: str, collector_id: str) -> int:
    digest = hashlib.sha256(f"{target_ref}\x00{collector_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def pick(req: PlacementRequest, candidates: Sequence[Candidate]) -> Candidate | None:
    """The deterministic choice among eligible candidates (None when there are none)."""
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda c: (c.load(req.provider), -_rendezvous(req.target_ref, c.collector_id), c.collector_id),
    )


def needs_lease(op_class: str, parallel_safe: bool) -> bool:
    """Reads and operations the driver declares parallel-safe bypass the device lease."""
    return op_class != OpClass.READ and not parallel_safe


def operation_cap(candidate: Candidate, req: PlacementRequest) -> OperationCap:
    op = _advertised(candidate, req)
    assert op is not None
    return op
