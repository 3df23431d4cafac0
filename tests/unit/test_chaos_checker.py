"""The chaos checker flags each broken promise (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import datetime as dt
import json
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
        # Named with the server-side fault before it, to read a failure by.
        "outside 503 at +110.0s outside any fault window"
        " (last server-side fault: router_restart +10.0s to +13.0s)",
    ]


def test_a_collector_fault_never_excuses_a_server_error() -> None:
    windows = [
        Window("collector_sigkill", 100.0, 103.0, "collector-1"),
        Window("connection_drop", 100, 101, "3"),
    ]
    problems = checker.outside_windows([(101.0, "POST /api/collector/v1/claim 503")], windows, origin=90.0)
    assert problems == ["POST /api/collector/v1/claim 503 at +11.0s outside any fault window"]


def _fact(state: str, *, deadline_s: float = 60, settled_s: float | None = 10, handed: int = 1,
          collectors: tuple[str, ...] = ("col-1",), error_code: str = "",
          stopped_mid_change: bool = False) -> checker.TaskFact:  # fmt: skip
    return checker.TaskFact(
        state, T0 + dt.timedelta(seconds=deadline_s), T0,
        None if settled_s is None else T0 + dt.timedelta(seconds=settled_s), error_code, collectors, handed,
        stopped_mid_change,
    )  # fmt: skip


def test_durable_task_facts_are_checked() -> None:
    clock = checker.Clock(wall=T0.timestamp(), mono=1000.0)
    tasks = [
        _task("late", "echo", ""),
        _task("failed-applied", "append", ""),
        _task("failed-untried", "apply_once", ""),
        _task("indeterminate-quiet", "append", ""),
        _task("indeterminate-killed", "append", ""),
        Submitted("cancelled-mid-change", "apply_once", "dev-1", task_id="tsk-c1", cancel_code="ok"),
        Submitted("cancel-claimed-only", "apply_once", "dev-1", task_id="tsk-c2", cancel_code="ok"),
        _task("unoffered-ran", "nonexistent", ""),
        Submitted("lie", "append", "dev-1", task_id="tsk-lie", lie=True),
        _task("fine", "echo", ""),
    ]
    facts = {
        "late": _fact("expired", deadline_s=60, settled_s=80),
        "failed-applied": _fact("failed"),
        "failed-untried": _fact("failed", handed=0, error_code="device_leased"),
        "indeterminate-quiet": _fact("indeterminate"),
        "indeterminate-killed": _fact("indeterminate", collectors=("col-2",)),
        # Cancelled after its change began, as its collector's report in PostgreSQL says: expected.
        "cancelled-mid-change": _fact("indeterminate", stopped_mid_change=True),
        # Cancelled, but nothing in PostgreSQL says the stop came mid-change: not an excuse.
        "cancel-claimed-only": _fact("indeterminate"),
        "unoffered-ran": _fact("success"),
        "lie": _fact("success"),
        "fine": _fact("success"),
    }
    # A SIGKILL of col-2's process while its task ran; the runner started at wall T0 = mono 1000.
    windows = [Window("collector_sigkill", 1005.0, 1006.0, "collector-2")]
    names = {"col-1": "collector-1", "col-2": "collector-2"}
    problems = checker.check_facts(
        tasks, facts, Counter({"failed-applied": 1, "lie": 1}), windows, clock, names
    )
    flagged = {p.split(" ", 1)[0] for p in problems}
    assert flagged == {
        "late", "failed-applied", "failed-untried", "indeterminate-quiet", "cancel-claimed-only",
        "unoffered-ran", "lie",
    }, problems  # fmt: skip
    # Final states come from PostgreSQL, not from the runner's memory.
    assert tasks[0].state == "expired"


def test_writes_out_of_epoch_order_or_past_their_window(tmp_path: Path) -> None:
    def write(key: str, epoch: int, at: float, expires_at: int) -> str:
        return json.dumps({"key": key, "epoch": epoch, "dispatch": "d", "expires_at": expires_at, "at": at})

    (tmp_path / "dev-ok").write_text("a\nb\n")
    (tmp_path / "dev-ok.writes").write_text(write("a", 1, 10.0, 20) + "\n" + write("b", 3, 30.0, 40) + "\n")
    (tmp_path / "dev-stale").write_text("k2\nk\n")
    (tmp_path / "dev-stale.writes").write_text(
        write("k2", 3, 30.0, 40) + "\n" + write("k", 1, 35.0, 40) + "\n"
    )
    (tmp_path / "dev-late").write_text("z\n")
    (tmp_path / "dev-late.writes").write_text(write("z", 1, 50.0, 40) + "\n")
    problems = checker.writer_order(tmp_path)
    assert sorted(p.split(":")[0] for p in problems) == ["dev-late", "dev-stale"], problems
    assert checker.applications(tmp_path) == Counter({"a": 1, "b": 1, "k2": 1, "k": 1, "z": 1})
