"""The two fleet state machines, as pure functions: a collector's status and its session's state.

They are independent on purpose. *Status* is the collector's standing with
the control plane (stored in PostgreSQL, changed by enrollment and operator
actions, except ``expired`` which follows from the certificate's end date by
itself). *Session state* is what its connection is doing right now (derived
from the last heartbeat in Redis and the drain flags). A revoked collector can
still have a live-looking session for the instant before its next request is
refused; an active collector can have a dead session because it is switched
off.

Thresholds (seconds since the last heartbeat, i.e. the last claim):

- ``active`` up to STALE_AFTER_S (two default 25 s claim holds plus slack);
- ``stale`` after that, ``dead`` after DEAD_AFTER_S, which is also the
  router's placement window (router/core/live.py), so a dead session never
  receives work;
- ``draining`` while not dead and drained by an operator or by the collector;
- a probe calls the collector reachable while the heartbeat is under
  REACHABLE_S old. A probe reads the session's health; it makes no round trip.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

STALE_AFTER_S = 60.0
REACHABLE_S = 90.0
DEAD_AFTER_S = 180.0  # router/core/live.py takes its placement window from here


class CollectorStatus(enum.StrEnum):
    PENDING = "pending"
    ACTIVE = "active"
    DENIED = "denied"
    REVOKED = "revoked"
    EXPIRED = "expired"


class SessionState(enum.StrEnum):
    ACTIVE = "active"
    STALE = "stale"
    DRAINING = "draining"
    DEAD = "dead"
    # It said goodbye (a clean shutdown) and has not claimed since: planned, not lost.
    OFFLINE = "offline"


def collector_status(stored: str, cert_not_after: dt.datetime, now: dt.datetime) -> CollectorStatus:
    """The effective status: a stored ``pending``/``active`` becomes ``expired`` once the certificate ends.

    Revoked and denied stay what they are: they are final, and saying "expired"
    would hide why the collector was cut off.
    """
    status = CollectorStatus(stored)
    if status in (CollectorStatus.PENDING, CollectorStatus.ACTIVE) and cert_not_after <= now:
        return CollectorStatus.EXPIRED
    return status


def heartbeat_age(last_heartbeat: float | None, now: float) -> float | None:
    """Seconds since the last heartbeat (never negative), or None if there never was one."""
    return None if last_heartbeat is None else max(0.0, now - last_heartbeat)


def session_state(
    last_heartbeat: float | None, drained: bool, now: float, said_goodbye: bool = False
) -> SessionState:
    """The session's state from its last heartbeat, whether it is drained (by operator or itself)
    and whether it said goodbye since its last claim (offline: a planned absence, not a loss)."""
    age = heartbeat_age(last_heartbeat, now)
    if said_goodbye:
        return SessionState.OFFLINE
    if age is None or age > DEAD_AFTER_S:
        return SessionState.DEAD
    if drained:
        return SessionState.DRAINING
    return SessionState.ACTIVE if age <= STALE_AFTER_S else SessionState.STALE


@dataclass(frozen=True)
class Probe:
    reachable: bool
    heartbeat_age_s: float | None
    session: SessionState


def probe(last_heartbeat: float | None, drained: bool, now: float, said_goodbye: bool = False) -> Probe:
    """What ``collectors probe`` reports: reachability from the heartbeat age, and the session state."""
    age = heartbeat_age(last_heartbeat, now)
    return Probe(
        reachable=age is not None and age < REACHABLE_S and not said_goodbye,
        heartbeat_age_s=age,
        session=session_state(last_heartbeat, drained, now, said_goodbye),
    )


def routable(status: CollectorStatus, session: SessionState) -> bool:
    """Whether new work may be placed on the collector: active standing and an active or stale session."""
    return status is CollectorStatus.ACTIVE and session in (SessionState.ACTIVE, SessionState.STALE)
