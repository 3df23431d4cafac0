"""Cancel of running work with real processes: the control plane, a current collector and its stub
devices. Each class of operation ends as docs/protocol.md (cancel) says, judged from the device
files and the task's own history, in seconds where the driver would have taken a minute."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from versus.router.v1 import task_pb2

from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane

pytestmark = pytest.mark.timeout(240)

# What each stub operation would take if nobody stopped it: the cancel must end it long before.
LONG_S = 60
# How long a cancel may take to end a task here (one claim round trip and a report, at most).
PROMPT_S = 15


@pytest.fixture
def fleet(shared_control_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[Collector, Platform]]:
    cp = shared_control_plane
    c = Collector(cp, tmp_path / "c", tmp_path / "c.log", devices=tmp_path / "devices")
    c.enroll()
    c.start()
    platform = Platform(cp)
    yield c, platform
    c.stop()
    platform.close()


def _run_then_cancel(
    c: Collector, platform: Platform, operation: str, op_class: str, params: dict[str, Any], key: str
) -> tuple[Any, float]:
    task_id = platform.submit(c.site_id, operation, op_class, f"dev-{key}", params, key, features=["cancel"])
    platform.wait_state(task_id, {"dispatched"}, timeout=60)
    time.sleep(1.0)  # the driver is running (holding, or paused after its write)
    asked = platform.cancel(task_id, "operator changed their mind")
    assert asked.HasField("cancel_requested_at")
    started = time.monotonic()
    done = platform.wait_state(
        task_id, {"cancelled", "success", "failed", "indeterminate"}, timeout=PROMPT_S + 5
    )
    return done, time.monotonic() - started


def _reasons(task: Any) -> list[str]:
    return [t.reason for t in task.history]


def test_cancel_of_a_running_read_ends_it_cancelled(fleet: tuple[Collector, Platform]) -> None:
    c, platform = fleet
    task, took = _run_then_cancel(c, platform, "echo", "read", {"sleep": LONG_S}, "read-1")
    assert task.state == task_pb2.TASK_STATE_CANCELLED, _reasons(task)
    assert took < PROMPT_S
    assert "cancel requested: operator changed their mind" in _reasons(task)
    assert "cancel: asking the driver to stop" in c.log()


def test_cancel_of_a_mutation_before_its_write_leaves_the_device_untouched(
    fleet: tuple[Collector, Platform],
) -> None:
    c, platform = fleet
    task, took = _run_then_cancel(c, platform, "append", "mutate_reconcilable", {"hold": LONG_S}, "hold-1")
    assert task.state == task_pb2.TASK_STATE_CANCELLED, _reasons(task)
    assert took < PROMPT_S
    assert c.device("dev-hold-1") == [] and c.writes("dev-hold-1") == []


def test_cancel_of_a_reconcilable_mutation_after_its_write_is_settled_by_reading_the_device(
    fleet: tuple[Collector, Platform],
) -> None:
    c, platform = fleet
    params = {"sleep": LONG_S}
    task, took = _run_then_cancel(c, platform, "append", "mutate_reconcilable", params, "after-1")
    # Stopped after the write: the outcome was unknown at that instant, and the reconcile-read
    # found the change on the device. Success, applied exactly once, never retried blind.
    assert task.state == task_pb2.TASK_STATE_SUCCESS, _reasons(task)
    assert took < PROMPT_S
    assert c.device("dev-after-1") == ["after-1"]
    assert task.attempts == 1


def test_cancel_of_a_terminal_mutation_after_its_write_waits_for_an_operator(
    fleet: tuple[Collector, Platform],
) -> None:
    c, platform = fleet
    task, took = _run_then_cancel(c, platform, "apply_once", "mutate_terminal", {"sleep": LONG_S}, "term-1")
    # Not safely repeatable and not confirmable: the unknown outcome goes to the operator queue.
    assert task.state == task_pb2.TASK_STATE_INDETERMINATE, _reasons(task)
    assert took < PROMPT_S
    assert "cancelled_mid_change" in task.evidence
    assert c.device("dev-term-1") == ["term-1"]
