"""A shutdown step that runs long is named in the log with what the loop's tasks wait on, and is
still awaited to its end (common/runtime/tasks.py ``watched_step``)."""

from __future__ import annotations

import asyncio
from typing import Any

from common.runtime.tasks import watched_step


class _Log:
    def __init__(self) -> None:
        self.warnings: list[dict[str, Any]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append({"event": event, **fields})


async def test_a_slow_step_is_named_with_the_tasks_and_still_finishes() -> None:
    log = _Log()
    finished = asyncio.Event()

    async def slow_close() -> None:
        await asyncio.sleep(0.3)
        finished.set()

    await watched_step("backends", slow_close(), log, warn_after_s=0.05)
    assert finished.is_set()  # not cut short
    [warning] = log.warnings
    assert (warning["event"], warning["step"]) == ("shutdown step still running", "backends")
    assert any("slow_close" in line for line in warning["tasks"])


async def test_a_quick_step_logs_nothing() -> None:
    log = _Log()
    await watched_step("parking", asyncio.sleep(0), log, warn_after_s=1.0)
    assert log.warnings == []
