"""Which claims look again for work (router/core/wakes.py WakeHub notes, router/dispatch/handout.py
retakes)."""

from __future__ import annotations

import time
from typing import Any

from common.redis.keys import WORK_TEXT
from router.core.wakes import WakeHub


def _hub() -> WakeHub:
    redis: Any = None  # the notes never touch Redis
    return WakeHub(redis)


def test_work_announced_after_the_last_take_is_pending_and_a_take_settles_it() -> None:
    hub = _hub()
    since = time.monotonic() - 1.0
    assert not hub.work_announced_since("col-1", since)
    hub.wake("col-1", WORK_TEXT)
    assert hub.work_announced_since("col-1", since)
    assert not hub.work_announced_since("col-2", since)
    hub.taken("col-1")  # the work it was told of has been taken: nothing to look again for
    assert not hub.work_announced_since("col-1", since)
    hub.wake("col-1", WORK_TEXT)
    assert hub.work_announced_since("col-1", since)


def test_an_old_announcement_or_another_wake_up_is_not_pending_work() -> None:
    hub = _hub()
    hub.wake("col-1", WORK_TEXT)
    assert not hub.work_announced_since("col-1", time.monotonic() + 1.0)
    hub.wake("col-2", "1")  # a standing wake-up, not work
    assert not hub.work_announced_since("col-2", time.monotonic() - 1.0)
