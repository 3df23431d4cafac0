"""The router's hot-path SQL texts are assembled from constants and schema column names only."""

from __future__ import annotations

import itertools

import pytest

from router.dispatch import sql_dispatches, sql_tasks


def test_a_transition_may_set_only_columns_of_tasks() -> None:
    with pytest.raises(ValueError, match="not columns of tasks"):
        sql_tasks._transitions_sql(("state = 'x'; DROP TABLE tasks; --",), 1, False, False, False)


async def test_a_dispatch_update_may_set_only_columns_of_dispatches() -> None:
    with pytest.raises(ValueError, match="not columns of dispatches"):
        await sql_dispatches.update_dispatch(None, "dsp-1", **{"state = 'x' --": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "flags", list(itertools.product([False, True], repeat=3)), ids=lambda f: "-".join(map(str, f))
)
def test_every_transition_text_has_its_parts_once_and_bound_values_only(
    flags: tuple[bool, bool, bool],
) -> None:
    with_dispatch, answering, releasing = flags
    text = sql_tasks._transitions_sql(("condition", "error_code"), 2, with_dispatch, answering, releasing)
    assert text.count("INSERT INTO task_transitions") == 1
    assert text.count("UNION ALL") == 1
    assert ("INSERT INTO dispatches" in text) is with_dispatch
    assert ("answered AS" in text) is answering
    assert ("released AS" in text) is releasing
    # Values arrive as parameters: the only quoted literals are the fixed states the text names.
    assert "condition = %(v_condition)s" in text and "error_code = %(v_error_code)s" in text
