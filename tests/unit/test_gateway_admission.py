"""Admission at the listener, fed values (gateway/admission.py)."""

from __future__ import annotations

import pytest

from gateway.admission import START, WAIT, Admission, AdmissionLimits, HandshakeBudget, Shed


def _admission(**limits: float) -> Admission[str]:
    return Admission(AdmissionLimits(**limits))  # type: ignore[arg-type]


def test_handshakes_start_up_to_the_bound_then_wait_in_arrival_order() -> None:
    admission = _admission(max_handshakes=2, max_waiting=10)
    assert [admission.arrive(c, 0, now=0.0) for c in "abcd"] == [START, START, WAIT, WAIT]
    assert (admission.handshaking, admission.waiting) == (2, 2)
    # A slot frees: the oldest waiting connection takes it.
    assert admission.ended(now=1.0) == ("c", [])
    assert admission.ended(now=1.0) == ("d", [])
    assert admission.ended(now=1.0) == (None, [])
    assert (admission.handshaking, admission.waiting) == (1, 0)


def test_a_full_line_sheds_at_once() -> None:
    admission = _admission(max_handshakes=1, max_waiting=1)
    assert [admission.arrive(c, 0, now=0.0) for c in "abc"] == [START, WAIT, Shed.LINE_FULL]
    assert admission.shed == {Shed.LINE_FULL: 1}


def test_those_that_waited_too_long_are_shed_when_a_slot_frees() -> None:
    admission = _admission(max_handshakes=1, max_wait_s=5.0)
    admission.arrive("a", 0, now=0.0)
    admission.arrive("old1", 0, now=0.0)
    admission.arrive("old2", 0, now=1.0)
    admission.arrive("fresh", 0, now=4.0)
    # At 7.0 the first two waited 7 s and 6 s: shed; the fresh one (3 s) starts.
    assert admission.ended(now=7.0) == ("fresh", ["old1", "old2"])
    assert admission.shed == {Shed.WAITED_TOO_LONG: 2}
    assert admission.handshaking == 1


def test_handshakes_and_waiting_ones_count_toward_the_connection_limit() -> None:
    admission = _admission(max_handshakes=1, max_waiting=10, max_connections=4)
    assert admission.arrive("a", 2, now=0.0) == START  # 2 open + this one
    assert admission.arrive("b", 2, now=0.0) == WAIT  # 2 open + 1 handshaking + this one
    assert admission.arrive("c", 2, now=0.0) == Shed.CONNECTION_LIMIT
    assert admission.waiting == 1


def test_drain_returns_the_waiting_line_and_empties_it() -> None:
    admission = _admission(max_handshakes=1)
    for c in "abc":
        admission.arrive(c, 0, now=0.0)
    assert admission.drain() == ["b", "c"]
    assert admission.waiting == 0


def test_an_end_without_a_start_is_a_bug_not_a_negative_count() -> None:
    with pytest.raises(RuntimeError):
        _admission().ended(now=0.0)


@pytest.mark.parametrize(
    "limits", [{"max_handshakes": 0}, {"max_connections": 0}, {"max_waiting": -1}, {"max_wait_s": 0}]
)
def test_limits_out_of_range_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"admission limits|longest wait"):
        AdmissionLimits(**limits)  # type: ignore[arg-type]


def test_the_budget_halves_at_each_late_sample_down_to_its_floor_and_grows_back_by_steps() -> None:
    budget = HandshakeBudget(64, floor=4, target_s=0.05)
    assert [budget.observe(0.2) for _ in range(5)] == [32, 16, 8, 4, 4]
    assert budget.observe(0.05) == 8  # at the target is on time: +64/16
    assert [budget.observe(0.0) for _ in range(16)][-1] == 64
    assert budget.observe(0.0) == 64  # never above the configured bound
    assert HandshakeBudget(2, floor=4).floor == 2  # a bound below the floor is the floor


def test_a_late_loop_holds_new_connections_and_they_start_as_it_catches_up() -> None:
    admission = _admission(max_handshakes=8, max_waiting=10)
    for _ in range(2):
        assert admission.observe(1.0, now=0.0) == ([], [])
    assert admission.budget.limit == 4
    assert [admission.arrive(c, 0, now=0.0) for c in "abcdef"] == [START] * 4 + [WAIT] * 2
    # One ends while the loop is still late: its place goes to the next in line.
    assert admission.ended(now=0.5) == ("e", [])
    # The loop keeps time again: the budget grows and the rest of the line starts.
    assert admission.observe(0.0, now=1.0) == (["f"], [])
    assert (admission.handshaking, admission.waiting) == (5, 0)


def test_a_shrunk_budget_starts_no_one_in_place_of_an_ended_handshake() -> None:
    admission = _admission(max_handshakes=8, max_waiting=10)
    assert [admission.arrive(c, 0, now=0.0) for c in "abcdefghi"] == [START] * 8 + [WAIT]
    admission.observe(1.0, now=0.0)  # budget 4 with 8 running
    assert admission.ended(now=0.1) == (None, [])
    assert (admission.handshaking, admission.waiting) == (7, 1)


def test_those_that_waited_too_long_are_shed_at_a_sample_even_when_none_ends() -> None:
    admission = _admission(max_handshakes=1, max_waiting=10, max_wait_s=8.0)
    assert [admission.arrive(c, 0, now=0.0) for c in "ab"] == [START, WAIT]
    assert admission.observe(1.0, now=9.0) == ([], ["b"])
    assert admission.shed == {Shed.WAITED_TOO_LONG: 1}
