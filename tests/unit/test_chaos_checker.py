"""The chaos checker flags each broken promise (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

from chaos import checker
from chaos.faults import RECOVERY_S, Window
from chaos.workload import Submitted

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def _task(key: str, operation: str, state: str, refused: str = "") -> Submitted:
    return Submitted(
        key, operation, "dev-1", task_id="" if refused else f"tsk-{key}", refused=refused, state=state
    )


def test_counts_every_application_across_device_files(tmp_path: Path) -> None:
    (tmp_path / "dev-1").write_text("k1\nk2\n")
    (tmp_path / "dev-2").write_text("k1\n")
    assert checker.applications(tmp_path) == Counter({"k1": 2, "k2": 1})


def test_task_promises() -> None:
    tasks = [
        _task("twice", "apply_once", "success"),
        _task("lost", "append", "success"),
        _task("ghost", "append", "expired"),
        _task("stuck", "echo", "dispatched"),
        _task("fine", "append", "success"),
        _task("read", "echo", "success"),
        _task("refused", "apply_once", "", refused="device_leased"),
    ]
    applied = Counter({"twice": 2, "ghost": 1, "fine": 1})
    problems = checker.check_tasks(tasks, applied, {"refused": "queued"})
    assert len(problems) == 6, problems
    for key in ("twice", "lost", "ghost", "stuck", "refused"):
        assert any(p.startswith(key) for p in problems), key
    assert not any(p.startswith(("fine", "read")) for p in problems)


def test_overlapping_mutations_on_one_device() -> None:
    minute = dt.timedelta(minutes=1)
    spans = [
        ("dev-1", "d1", T0, T0 + minute),
        ("dev-1", "d2", T0 + 2 * minute, T0 + 3 * minute),
        ("dev-2", "d3", T0, None),  # still out
        ("dev-2", "d4", T0 + minute, T0 + 2 * minute),
        ("dev-3", "d5", T0, T0 + 2 * minute),
        ("dev-3", "d6", T0 + minute, T0 + 3 * minute),
    ]
    problems = checker.overlaps(spans)
    assert sorted(p.split(":")[0] for p in problems) == ["dev-2", "dev-3"]


def test_errors_outside_fault_windows_and_internal_errors_anywhere() -> None:
    windows = [Window("router_restart", 100.0, 103.0, "router")]
    errors = [
        (99.5, "inside (just before) 503"),
        (103.0 + RECOVERY_S - 1, "SubmitTask UNAVAILABLE database_unavailable"),
        (101.0, "POST /api/collector/v1/claim 500"),
        (200.0, "outside 503"),
    ]
    problems = checker.outside_windows(errors, windows, origin=90.0)
    assert problems == [
        "POST /api/collector/v1/claim 500 at +11.0s (internal error)",
        "outside 503 at +110.0s outside any fault window",
    ]
