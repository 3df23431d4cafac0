"""Whether a claim can park in the gateway or must be forwarded to the router: plain values in,
a reason out (gateway/parking/hub.py feeds it; tests/unit/test_claim_parking.py drives it).

A claim that repeats, word for word, a claim the router answered with nothing, while nothing
was announced for the collector since, would get the same empty answer from the router: the
gateway answers it itself when the hold ends, and records the heartbeat in Redis. Everything
else goes to the router: the first claim a gateway sees of a collector, any change in what the
collector says about itself (its session, capacity, drain, versions, held tasks, an upgrade
report), any wake-up for it (work, an offer, a cancel, a revocation, a new config, a newer
session elsewhere), any fleet-wide news (a key set or trust bundle rotation), a heartbeat Redis
would not record as given, a lost subscription, and at least every ``refresh_s`` regardless.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Forward(enum.StrEnum):
    """Why a claim goes to the router (the label of ``versus_gateway_claims_forwarded_total``)."""

    FIRST = "first"  # nothing answered empty on this watch yet (a new watch, or news before)
    NEWS = "news"  # the claim says something the last forwarded one did not
    WOKEN = "woken"  # a wake-up for the collector (or fleet news) arrived since
    LIVENESS = "liveness"  # Redis did not take a parked heartbeat as given (flushed, superseded, bye)
    UNSUBSCRIBED = "unsubscribed"  # this gateway is not (or no longer) subscribed to its wake-ups
    RESUME = "resume"  # the collector asks for verdicts on the tasks it holds
    SHORT = "short_hold"  # a poll (a hold under PARK_MIN_HOLD_S): answered by the router at once
    REFRESH = "refresh"  # the last forwarded claim is older than the refresh period


# A claim that asks for a shorter hold than this is a poll: it goes to the router, which sees
# work announced a moment before (a wake-up still on its way to this gateway would be missed).
PARK_MIN_HOLD_S = 1.0


@dataclass(frozen=True, slots=True)
class ClaimNews:
    """Everything a claim says besides "still here" and its sequence number: two claims with the
    same news get the same answer from the router, unless something was announced between them."""

    session_id: str
    transport: str
    protocol: int
    draining: bool
    agent_version: str
    vault_mode: str
    config_version: int
    max_tasks: int
    key_versions: tuple[tuple[str, int], ...]
    free_slots: tuple[tuple[str, int], ...]
    held_task_ids: tuple[str, ...]
    # The supervisor's upgrade report, as sorted (field, value) pairs; () for none.
    update_status: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class ParkState:
    """What a gateway knows about one collector's claims between them (one per watched collector)."""

    # The news of the last forwarded claim, once the router answered it with nothing.
    quiet: ClaimNews | None = None
    # When the last claim was forwarded (monotonic seconds).
    forwarded_at: float = float("-inf")
    # Set by a wake-up or a refused heartbeat; cleared when a claim is forwarded.
    pending: Forward | None = None

    def mark(self, why: Forward) -> None:
        """Something happened that the collector's next claim must take to the router."""
        if self.pending is None:
            self.pending = why

    def forwarding(self, now: float) -> None:
        """A claim goes to the router now: what it answers covers everything announced before."""
        self.pending = None
        self.quiet = None
        self.forwarded_at = now

    def answered(self, news: ClaimNews, empty: bool) -> None:
        """The router answered a forwarded claim; ``empty``: with nothing (a 204)."""
        # A wake-up that arrived while the claim was with the router stays pending.
        self.quiet = news if empty else None

    def forget(self) -> None:
        """The wake-up subscription was replaced: what came in the gap is unknown."""
        self.quiet = None


def forward_reason(
    state: ParkState,
    news: ClaimNews,
    now: float,
    *,
    subscribed: bool,
    resume: bool,
    refresh_s: float,
    hold_s: float,
) -> Forward | None:
    """Why this claim must go to the router, or None when the gateway may park it."""
    if not subscribed:
        return Forward.UNSUBSCRIBED
    if resume:
        return Forward.RESUME
    if hold_s < PARK_MIN_HOLD_S:
        return Forward.SHORT
    if state.pending is not None:
        return state.pending
    if state.quiet is None:
        return Forward.FIRST
    if state.quiet != news:
        return Forward.NEWS
    if now - state.forwarded_at >= refresh_s:
        return Forward.REFRESH
    return None
