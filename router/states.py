"""The task state machine: every legal transition, nothing else.

    queued -> routed -> leased -> dispatched -> running -> success | failed
    unknown -> reconciling -> indeterminate          (an outcome nobody could confirm)
    expired (deadline passed)   cancelled (by the caller)

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
    S.DISPATCHED: frozenset({S.RUNNING, S.SUCCESS, S.FAILED, S.UNKNOWN, S.QUEUED}),
    S.RUNNING: frozenset({S.SUCCESS, S.FAILED, S.UNKNOWN}),
    # The ladder: retry (queued), reconcile, or give up to a human.
    S.UNKNOWN: frozenset({S.QUEUED, S.RECONCILING, S.INDETERMINATE}),
    S.RECONCILING: frozenset({S.QUEUED, S.SUCCESS, S.FAILED, S.INDETERMINATE}),
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


def cancellable(state: State) -> bool:
    """Cancel is allowed until the work has been handed to a collector; after that it cannot be recalled."""
    return S.CANCELLED in TRANSITIONS[state]
