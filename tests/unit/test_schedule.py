"""The end-to-end suite's order: worksteal's first slices carry about equal recorded time."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.support.schedule import Unit, balanced, slice_sizes


def _unit(name: str, weight: float, n: int = 1) -> Unit:
    return Unit([cast(pytest.Item, f"{name}{i}") for i in range(n)], weight)


@pytest.mark.parametrize(
    ("total", "workers", "sizes"), [(108, 3, [36, 36, 36]), (107, 3, [35, 36, 36]), (5, 2, [2, 3])]
)
def test_slice_sizes_follow_worksteals_arithmetic(total: int, workers: int, sizes: list[int]) -> None:
    assert slice_sizes(total, workers) == sizes


def test_long_tests_are_spread_over_the_slices_longest_first() -> None:
    units = [_unit("a", 140), _unit("b", 125), _unit("c", 110)] + [_unit(f"s{i}-", 5) for i in range(9)]
    order: list[Any] = balanced(units, 3)
    slices = [order[0:4], order[4:8], order[8:12]]
    assert sorted(s[0] for s in slices) == ["a0", "b0", "c0"]  # one long test heads each slice
    assert sorted(order) == sorted(str(i) for u in units for i in u.items)  # nothing lost or repeated


def test_a_module_sharing_a_fixture_stays_in_one_run() -> None:
    units = [_unit("mod", 90, n=4), *(_unit(f"t{i}-", 10) for i in range(8))]
    order: list[Any] = balanced(units, 3)
    at = [order.index(f"mod{i}") for i in range(4)]
    assert at == list(range(at[0], at[0] + 4))
