"""Time is the fence between two writers of one device. Pure code.

Devices cannot check a fencing token, so the single-writer lease is fenced by
time: an envelope carries ``expires_at``, the collector never starts a task,
nor goes on into a device write, once its own clock says that time has passed
(:func:`window_open`), and the router hands a device to another writer only
after :func:`fence_after` of every envelope it issued under the lease that was
handed out and never answered.

The gap between the two is what the fence must cover:

* the collector's clock may disagree with the router's by up to
  :data:`~common.envelope.verify.SKEW_ALLOWANCE_S` (the same allowance the
  verifier grants at receipt; a collector corrects its clock only from fresh
  round trips, see :class:`RoundTrip`);
* a device write that passed its last check just before the window closed
  needs a moment to land (:data:`WRITE_MARGIN_S`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from common.envelope.verify import SKEW_ALLOWANCE_S

# A write checked against the window just before it closed lands within this.
WRITE_MARGIN_S = 5
# How long after an unanswered envelope's expires_at another writer may have its device.
FENCE_S = SKEW_ALLOWANCE_S + WRITE_MARGIN_S
# How long a leased mutation waits to be claimed before its envelope runs out (plus its run time).
CLAIM_WINDOW_S = 60
# A clock offset is taken only from a round trip this certain (half of it is the worst error).
MAX_ROUND_TRIP_UNCERTAINTY_S = 2.0


def mutation_expiry(
    now: dt.datetime, deadline: dt.datetime, op_timeout_s: float, ttl_s: float
) -> dt.datetime:
    """``expires_at`` of an envelope that holds a device: long enough to be claimed and run, no longer.

    A mutation's envelope bounds how long a silent holder keeps a device (its fence),
    so it is not given the general dispatch ttl but the claim window plus the
    operation's own timeout (never past the task deadline).
    """
    window = min(ttl_s, CLAIM_WINDOW_S + max(op_timeout_s, 1))
    return min(deadline, now + dt.timedelta(seconds=window))


def fence_after(expires_at: dt.datetime) -> dt.datetime:
    """When an unanswered envelope with this ``expires_at`` can no longer change its device."""
    return expires_at + dt.timedelta(seconds=FENCE_S)


def window_open(corrected_now_s: float, expires_at_s: int) -> bool:
    """Whether a collector may start a task, or go on into a device write, at this corrected time.

    No allowance here: the allowance is on the router's side, in the fence.
    """
    return corrected_now_s <= expires_at_s


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """One request/answer with the server's clock, for estimating the collector's clock offset.

    ``sent_s`` and ``received_s`` are local wall-clock times taken around the call,
    ``server_s`` the server's time when it answered and ``held_s`` how long the
    server held the request (a long-poll). The true offset lies within
    ``uncertainty_s`` of :meth:`offset_s`; a response that sat in a buffer while
    the process was frozen shows up as a large uncertainty and is not used.
    """

    sent_s: float
    received_s: float
    server_s: float
    held_s: float

    @property
    def uncertainty_s(self) -> float:
        return max(self.received_s - self.sent_s - max(self.held_s, 0.0), 0.0)

    def offset_s(self) -> float:
        # The answer travelled for about half of the time the server did not hold it.
        return self.server_s + self.uncertainty_s / 2 - self.received_s

    def usable(self, limit_s: float = MAX_ROUND_TRIP_UNCERTAINTY_S) -> bool:
        return self.received_s >= self.sent_s and self.uncertainty_s <= limit_s
