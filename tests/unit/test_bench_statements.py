"""The statement counter reads PostgreSQL's statement log as the server writes it (bench/statements.py)."""

from __future__ import annotations

from bench.statements import Counted, tally

LOG = """\
versus-router|LOG:  execute <unnamed>: SELECT tasks.task_id FROM tasks WHERE tasks.task_id = $1
versus-router|DETAIL:  parameters: $1 = 'tsk-1'
versus-router|LOG:  statement: BEGIN
versus-router|LOG:  execute _pg3_0: <TRAILING>
	WITH moved AS (UPDATE tasks SET state = $1)
	INSERT INTO task_transitions SELECT * FROM moved
versus-router|LOG:  statement: COMMIT
versus-gateway|LOG:  execute <unnamed>: SELECT collectors.collector_id FROM collectors
versus-cp-admin|LOG:  statement: SELECT 1
|LOG:  checkpoint starting: time
""".replace("<TRAILING>", "")  # a statement starting on a new line leaves "execute name: " alone


def test_statements_are_counted_per_service_with_transaction_control_apart() -> None:
    counted = Counted()
    tally(LOG.splitlines(keepends=True), counted)
    assert counted.statements == {"versus-router": 2, "versus-gateway": 1}
    assert counted.transaction_control == {"versus-router": 2}
    assert counted.per_task(2) == {
        "versus-gateway": 0.5, "versus-router": 1.0, "total": 1.5, "begin_commit_total": 1.0,
    }  # fmt: skip
    assert counted.top(1)[0] == (
        "versus-router: SELECT tasks.task_id FROM tasks WHERE tasks.task_id = $1",
        1.0,
    )


def test_a_statement_starting_on_a_new_line_is_shaped_by_its_first_sql_line() -> None:
    counted = Counted()
    tally(LOG.splitlines(keepends=True), counted)
    assert ("versus-router: WITH moved AS (UPDATE tasks SET state = $1)", 0.5) in counted.top(2, n=5)
    assert all(not shape.endswith(": ") for shape, _ in counted.top(5, n=5))
