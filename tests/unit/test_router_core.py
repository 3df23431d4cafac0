"""The router's pure core: state machine, unknown-outcome ladder, placement."""

from __future__ import annotations

import pytest

from router.core.states import (
    CANCEL_AT_ONCE,
    CANCEL_BY_REQUEST,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    State,
    cancellable,
    check_transition,
)
from router.dispatch import ladder, placement
from router.dispatch.placement import Candidate, OperationCap, PlacementRequest, ProviderCap

S = State


def test_every_state_has_an_entry_and_terminals_are_final() -> None:
    assert set(TRANSITIONS) == set(State)
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
    reachable = {target for targets in TRANSITIONS.values() for target in targets}
    assert reachable == set(State) - {S.QUEUED} | {S.QUEUED}


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.QUEUED, S.ROUTED), (S.ROUTED, S.LEASED), (S.LEASED, S.DISPATCHED), (S.DISPATCHED, S.RUNNING),
        (S.RUNNING, S.SUCCESS), (S.RUNNING, S.FAILED), (S.RUNNING, S.UNKNOWN), (S.UNKNOWN, S.RECONCILING),
        (S.RECONCILING, S.INDETERMINATE), (S.INDETERMINATE, S.SUCCESS), (S.QUEUED, S.EXPIRED),
        (S.DISPATCHED, S.QUEUED), (S.RUNNING, S.CANCELLED), (S.UNKNOWN, S.CANCELLED),
    ],
)  # fmt: skip
def test_documented_transitions_are_legal(current: State, target: State) -> None:
    check_transition(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.SUCCESS, S.FAILED), (S.QUEUED, S.RUNNING), (S.RUNNING, S.QUEUED), (S.INDETERMINATE, S.QUEUED),
        (S.CANCELLED, S.QUEUED), (S.INDETERMINATE, S.CANCELLED), (S.UNKNOWN, S.SUCCESS),
        (S.EXPIRED, S.QUEUED),
    ],
)  # fmt: skip
def test_illegal_transitions_are_rejected(current: State, target: State) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(current, target)


def test_cancel_at_once_before_hand_out_and_by_request_after() -> None:
    assert {s for s in State if cancellable(s)} == CANCEL_AT_ONCE | CANCEL_BY_REQUEST
    assert {S.QUEUED, S.ROUTED, S.LEASED} == CANCEL_AT_ONCE
    assert {S.DISPATCHED, S.RUNNING, S.UNKNOWN, S.RECONCILING} == CANCEL_BY_REQUEST
    # Finished work, and work waiting for an operator's verdict, is not cancelled.
    assert not any(cancellable(s) for s in (*TERMINAL, S.INDETERMINATE))


@pytest.mark.parametrize(
    ("op_class", "attempts", "step"),
    [
        ("read", 1, ladder.Step.RETRY),
        # Reads are retried until the deadline, however many attempts that takes.
        ("read", 3, ladder.Step.RETRY),
        ("read", 50, ladder.Step.RETRY),
        ("mutate_reconcilable", 1, ladder.Step.RECONCILE),
        ("mutate_reconcilable", 3, ladder.Step.RECONCILE),
        ("mutate_terminal", 1, ladder.Step.INDETERMINATE),
    ],
)
def test_ladder(op_class: str, attempts: int, step: ladder.Step) -> None:
    assert ladder.on_unknown(op_class, attempts) is step


def test_after_reconcile() -> None:
    assert ladder.after_reconcile(True, 1) is None
    assert ladder.after_reconcile(False, 1) is ladder.Step.RETRY
    # Known not applied and no attempts left: failed, not unknown.
    assert ladder.after_reconcile(False, 3) is ladder.Step.FAIL
    # No answer (lost, refused, inconclusive): ask again up to the bound, then an operator decides.
    assert ladder.after_reconcile(None, 1, reconciles=1) is ladder.Step.RECONCILE
    assert ladder.after_reconcile(None, 1, reconciles=2) is ladder.Step.RECONCILE
    assert ladder.after_reconcile(None, 1, reconciles=3) is ladder.Step.INDETERMINATE


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        ("unknown_kid", ladder.Refusal.PERMANENT),
        ("kid_expired", ladder.Refusal.PERMANENT),
        ("bad_signature", ladder.Refusal.PERMANENT),
        ("wrong_collector", ladder.Refusal.PERMANENT),
        ("params_hash_mismatch", ladder.Refusal.PERMANENT),
        ("malformed", ladder.Refusal.PERMANENT),
        ("expired", ladder.Refusal.REROUTE),
        ("not_yet_valid", ladder.Refusal.REROUTE),
        ("window_closed", ladder.Refusal.REROUTE),
        ("replayed_task", ladder.Refusal.ALREADY_HELD),
    ],
)
def test_refusals(code: str, verdict: ladder.Refusal) -> None:
    assert ladder.on_refusal(code) is verdict


def test_never_received_rule() -> None:
    handed = ladder.HandOut(claim_seq=5, reported=False)
    assert ladder.never_received(handed, 6, frozenset(), "d1")
    assert not ladder.never_received(handed, 6, frozenset({"d1"}), "d1")  # the collector holds it
    assert not ladder.never_received(handed, 5, frozenset(), "d1")  # not a later claim
    assert not ladder.never_received(ladder.HandOut(5, True), 6, frozenset(), "d1")  # it reported
    assert not ladder.never_received(ladder.HandOut(0, False), 6, frozenset(), "d1")  # unnumbered claims


def _cand(cid: str, *, in_flight: int = 0, cap: int = 4, **kw: object) -> Candidate:
    ops = {"echo": OperationCap("read"), "set": OperationCap("mutate_terminal")}
    base: dict[str, object] = {
        "collector_id": cid, "site_id": "s1", "tenant_id": "t1", "active": True, "draining": False,
        "live": True,
        "fips": False, "providers": {"stub": ProviderCap(cap, ops)}, "in_flight": {"stub": in_flight},
    }  # fmt: skip
    base.update(kw)
    return Candidate(**base)  # type: ignore[arg-type]


REQ = PlacementRequest("stub", "echo", "read", "s1", "t1", "dev-1")


@pytest.mark.parametrize(
    "excluded",
    [
        _cand("c", active=False), _cand("c", draining=True), _cand("c", live=False), _cand("c", site_id="s2"),
        _cand("c", tenant_id="t2"), _cand("c", in_flight=4), _cand("c", providers={}),
    ],
)  # fmt: skip
def test_each_eligibility_rule_excludes(excluded: Candidate) -> None:
    assert placement.eligible(REQ, [excluded]) == []


def test_fips_required() -> None:
    req = PlacementRequest("stub", "echo", "read", "s1", "t1", "dev-1", requires_fips=True)
    assert placement.eligible(req, [_cand("a")]) == []
    assert [c.collector_id for c in placement.eligible(req, [_cand("a", fips=True)])] == ["a"]


@pytest.mark.parametrize(
    "witness", [_cand("a"), _cand("a", live=False), _cand("a", draining=True), _cand("a", in_flight=4)]
)
def test_op_class_mismatch_is_refused(witness: Candidate) -> None:
    """Any active collector of the site that advertises the operation exposes the lie, even one
    that is silent (Redis just lost its data), draining or full."""
    lying = PlacementRequest("stub", "set", "read", "s1", "t1", "dev-1")
    with pytest.raises(placement.OpClassMismatch, match="declared mutate_terminal"):
        placement.eligible(lying, [witness])


def test_pick_is_deterministic_least_loaded_and_spreads() -> None:
    cands = [_cand("a", in_flight=2), _cand("b", in_flight=1), _cand("c", in_flight=3)]
    assert placement.pick(REQ, cands).collector_id == "b"  # type: ignore[union-attr]
    level = [_cand("a"), _cand("b"), _cand("c")]
    first = placement.pick(REQ, level)
    assert first == placement.pick(REQ, list(reversed(level)))
    picks = [
        placement.pick(PlacementRequest("stub", "echo", "read", "s1", "t1", f"dev-{i}"), level)
        for i in range(40)
    ]
    targets = {p.collector_id for p in picks if p is not None}  # fmt: skip
    assert targets == {"a", "b", "c"}
    assert placement.pick(REQ, []) is None


def test_needs_lease() -> None:
    assert not placement.needs_lease("read", False)
    assert placement.needs_lease("mutate_terminal", False)
    assert placement.needs_lease("mutate_reconcilable", False)
    assert not placement.needs_lease("mutate_reconcilable", True)
