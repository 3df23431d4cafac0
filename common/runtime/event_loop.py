"""The event loop a service process runs on (``VERSUS_EVENT_LOOP``).

uvloop (libuv, in Cython) or the standard library's selector loop; docs/benchmarks.md has the
measured A/B that chose the default.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from common.config.settings import EventLoop

T = TypeVar("T")


def loop_factory(kind: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop ``kind`` names; None for the standard library's default."""
    if kind is EventLoop.UVLOOP:
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], kind: EventLoop) -> T:
    """Run ``main`` to completion on a new loop of the given kind, as :func:`asyncio.run` does."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main)
