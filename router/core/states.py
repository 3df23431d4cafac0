"""The task state machine: every legal transition, nothing else.

    queued -> routed -> leased -> dispatched -> running -> success | failed
    unknown -> reconciling -> indeterminate          (an outcome nobody could confirm)
    expired (deadline passed)   cancelled (by the caller)

Work not yet handed to a collector is cancelled at once. Work a collector holds
(dispatched, running) is cancelled when its collector says it stopped it, and
from the ladder's states when a cancel was asked for and the ladder would
otherwise try again (docs/protocol.md, cancel).

A task's state is the state of its current dispatch attempt, plus the states
only a task has (queued, expired, cancelled, indeterminate). Pure code.
"""

from __future__ import annotations

from enum import StrEnum

from common.errors import FailedPrecondition


class State(StrEnum):
    QUEUED = "queued"
    ROUTED = "routed"
    LEASED = "leased"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RECONCILING = "reconciling"
    INDETERMINATE = "indeterminate"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


S = State

TERMINAL = frozenset({S.SUCCESS, S.FAILED, S.EXPIRED, S.CANCELLED})
# Work a collector holds: these count against its concurrency and keep the device lease.
IN_FLIGHT = frozenset({S.LEASED, S.DISPATCHED, S.RUNNING})

TRANSITIONS: dict[State, frozenset[State]] = {
    # Placement found a collector, or will be retried; no eligible collector keeps it queued.
    S.QUEUED: frozenset({S.ROUTED, S.EXPIRED, S.CANCELLED, S.FAILED}),
    # Lease and sign; losing a capacity race sends it back to the queue.
    S.ROUTED: frozenset({S.LEASED, S.QUEUED, S.FAILED, S.EXPIRED, S.CANCELLED}),
    # Waiting for the collector's claim. Never handed out, so it may go back to the queue.
    S.LEASED: frozenset({S.DISPATCHED, S.QUEUED, S.EXPIRED, S.CANCELLED}),
    # Handed out. Back to queued only when the collector provably never received it.
    S.DISPATCHED: frozenset({S.RUNNING, S.SUCCESS, S.FAILED, S.UNKNOWN, S.QUEUED, S.CANCELLED}),
    S.RUNNING: frozenset({S.SUCCESS, S.FAILED, S.UNKNOWN, S.CANCELLED}),
    # The ladder: retry (queued), reconcile, or give up to a human; cancelled instead of a retry.
    S.UNKNOWN: frozenset({S.QUEUED, S.RECONCILING, S.INDETERMINATE, S.CANCELLED}),
    S.RECONCILING: frozenset({S.QUEUED, S.SUCCESS, S.FAILED, S.INDETERMINATE, S.CANCELLED}),
    # Only an operator resolves an indeterminate task.
    S.INDETERMINATE: frozenset({S.SUCCESS, S.FAILED}),
    S.SUCCESS: frozenset(),
    S.FAILED: frozenset(),
    S.EXPIRED: frozenset(),
    S.CANCELLED: frozenset(),
}


class IllegalTransition(FailedPrecondition):
    default_code = "illegal_transition"


def can_transition(current: State, target: State) -> bool:
    return target in TRANSITIONS[current]


def check_transition(current: State, target: State) -> None:
    """Raise :class:`IllegalTransition` unless ``current -> target`` is listed above."""
    if not can_transition(current, target):
        raise IllegalTransition(f"a {current.value} task cannot become {target.value}")


# Cancelled at once: nothing was handed to a collector yet.
CANCEL_AT_ONCE = frozenset({S.QUEUED, S.ROUTED, S.LEASED})
# Cancelled by request: the collector that holds the work is asked to stop it (dispatched, running;
# protocol 3), and the ladder ends the task cancelled where it would try again (unknown, reconciling).
CANCEL_BY_REQUEST = frozenset({S.DISPATCHED, S.RUNNING, S.UNKNOWN, S.RECONCILING})


def cancellable(state: State) -> bool:
    """Whether a cancel can be accepted in ``state``: at once, or as a request to the collector."""
    return state in CANCEL_AT_ONCE or state in CANCEL_BY_REQUEST
