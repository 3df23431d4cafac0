"""What to do with an outcome nobody could confirm, decided by operation class. Pure code.

    read                 -> retry: a new dispatch with a new task id and the same idempotency key,
                            until the task's deadline
    mutate_reconcilable  -> reconcile: dispatch the driver's reconcile-read (again, up to the bound,
                            when it is lost or inconclusive); retry while attempts remain
    mutate_terminal      -> indeterminate: never retried automatically, an operator decides

When the unknown outcome is a silent holder, the reconcile-read waits for the
lost envelope's fence (common/envelope/fence.py): before that, the holder may
still write, and a "not applied" answer would be stale.

A dispatch the collector provably never received is not an unknown outcome at
all: it is re-routed whatever its class (see :func:`never_received`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from common.envelope.canonical import OpClass

DEFAULT_MAX_ATTEMPTS = 3


class Step(StrEnum):
    RETRY = "retry"
    RECONCILE = "reconcile"
    INDETERMINATE = "indeterminate"
    FAIL = "fail"


def on_unknown(op_class: str, attempts: int, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Step:
    """The ladder step for an unknown outcome after ``attempts`` execution attempts.

    A read is retried whatever the count: it changes nothing, and the task's deadline
    bounds it. A reconcilable mutation is always reconciled first (the reconcile-read
    decides whether attempts remain); a terminal one goes to an operator.
    """
    if op_class == OpClass.READ:
        return Step.RETRY
    if op_class == OpClass.MUTATE_RECONCILABLE:
        return Step.RECONCILE
    return Step.INDETERMINATE


def after_reconcile(
    applied: bool | None,
    attempts: int,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    reconciles: int = 1,
) -> Step | None:
    """Next step once the reconcile-read answered (or was lost).

    ``applied`` True: the change landed, the task succeeded (``None`` - nothing more to do).
    False: it did not land; retry while execution attempts remain, else the task failed
    (it is known not to have landed). None (the read was
    inconclusive, refused or lost on the way): ask again while ``reconciles`` - the
    reconcile-reads sent so far - is under the bound, then indeterminate.
    """
    if applied is True:
        return None
    if applied is False:
        return Step.RETRY if attempts < max_attempts else Step.FAIL
    return Step.RECONCILE if reconciles < max_attempts else Step.INDETERMINATE


class Refusal(StrEnum):
    """What a collector's refusal of an envelope means for the dispatch."""

    # The collector already holds this dispatch: its real report will follow. Nothing changes.
    ALREADY_HELD = "already_held"
    # Specific to that collector (its clock, or the window ran out before it could start):
    # the work never ran there, so it may go to another collector - once per collector.
    REROUTE = "reroute"
    # Any collector would refuse it (key, signature, params, addressing): the dispatch ends.
    PERMANENT = "permanent"


_COLLECTOR_SPECIFIC = frozenset({"not_yet_valid", "expired", "window_closed"})


def on_refusal(code: str) -> Refusal:
    """Classify a collector's refusal code (docs/envelope.md lists them)."""
    if code == "replayed_task":
        return Refusal.ALREADY_HELD
    if code in _COLLECTOR_SPECIFIC:
        return Refusal.REROUTE
    return Refusal.PERMANENT


@dataclass(frozen=True, slots=True)
class HandOut:
    """When and in which claim a dispatch was handed to its collector."""

    claim_seq: int
    reported: bool


def never_received(
    hand_out: HandOut, later_claim_seq: int, held_task_ids: frozenset[str], dispatch_id: str
) -> bool:
    """True when a later claim proves the collector never received the dispatch.

    It applies only when all of these hold: the collector numbers its claims
    (``claim_seq`` > 0) and sends them one at a time, journaling every envelope
    it receives before sending the next claim; the proving claim is a later one
    (greater ``claim_seq``) than the claim that handed the dispatch out; the
    dispatch is not among the task ids the collector says it holds; and the
    collector never reported on it. Then the collector cannot have executed it.
    """
    return (
        hand_out.claim_seq > 0
        and later_claim_seq > hand_out.claim_seq
        and not hand_out.reported
        and dispatch_id not in held_task_ids
    )
