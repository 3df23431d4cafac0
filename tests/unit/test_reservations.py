"""Slot holds of a router process (router/dispatch/reservations.py), fed values."""

from __future__ import annotations

from router.dispatch.reservations import Reservations


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hold_counts_until_released_and_a_second_release_is_harmless() -> None:
    held = Reservations(hold_s=2.0, clock=Clock())
    first = held.hold("col-a", "ssh")
    held.hold("col-a", "ssh")
    held.hold("col-b", "http")
    assert held.held("ssh") == {"col-a": 2}
    assert held.held("http") == {"col-b": 1}
    first()
    first()
    assert held.held("ssh") == {"col-a": 1}
    assert held.held("none") == {}


def test_a_hold_never_released_lapses() -> None:
    clock = Clock()
    held = Reservations(hold_s=2.0, clock=clock)
    held.hold("col-a", "ssh")
    clock.now += 1.9
    kept = held.hold("col-a", "ssh")
    assert held.held("ssh") == {"col-a": 2}
    clock.now += 0.2  # the first hold is 2.1 s old now, the second 0.2 s
    assert held.held("ssh") == {"col-a": 1}
    kept()
    assert held.held("ssh") == {}
