"""Background tasks a service owns: ended the same way everywhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has unwound, so what it held is released before
    the caller goes on; its cancellation is not the caller's."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def watched_step(name: str, step: Awaitable[Any], log: Any, warn_after_s: float = 20.0) -> None:
    """Await one step of a service's shutdown; if it has not finished after ``warn_after_s``, log
    which step it is and what every task of the loop is waiting on, then keep waiting. Nothing is
    cut short (a close that never ends is a defect to find, not to hide); the log says where."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait([task], timeout=warn_after_s)
    if not done:
        stacks = []
        for other in asyncio.all_tasks():
            frames = other.get_stack(limit=8)
            where = " <- ".join(f"{f.f_code.co_qualname}:{f.f_lineno}" for f in reversed(frames))
            stacks.append(f"{other.get_name()}: {where}")
        log.warning("shutdown step still running", step=name, after_s=warn_after_s, tasks=stacks)
    await task
