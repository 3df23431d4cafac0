"""What to do with an outcome nobody could confirm, decided by operation class. Pure code.

    read                 -> retry: a new dispatch with a new task id and the same idempotency key
    mutate_reconcilable  -> reconcile: dispatch the driver's reconcile-read; retry while attempts remain
    mutate_terminal      -> indeterminate: never retried automatically, an operator decides

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


def on_unknown(op_class: str, attempts: int, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Step:
    """The ladder step for an unknown outcome after ``attempts`` execution attempts."""
    if op_class == OpClass.READ:
        return Step.RETRY if attempts < max_attempts else Step.INDETERMINATE
    if op_class == OpClass.MUTATE_RECONCILABLE:
        return Step.RECONCILE
    return Step.INDETERMINATE


def after_reconcile(
    applied: bool | None, attempts: int, max_attempts: int = DEFAULT_MAX_ATTEMPTS
) -> Step | None:
    """Next step once the reconcile-read answered.

    ``applied`` True: the change landed, the task succeeded (``None`` - nothing more to do).
    False: it did not land; retry while attempts remain. None (the read itself was
    inconclusive): indeterminate.
    """
    if applied is True:
        return None
    if applied is False and attempts < max_attempts:
        return Step.RETRY
    return Step.INDETERMINATE


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
