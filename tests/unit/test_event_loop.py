"""The services' event loop follows VERSUS_EVENT_LOOP."""

from __future__ import annotations

import asyncio

import uvloop

from common.config.settings import EventLoop, Settings
from common.runtime import event_loop


async def _running_loop() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_uvloop_is_the_default_and_runs_the_service() -> None:
    assert Settings().event_loop is EventLoop.UVLOOP
    assert event_loop.run(_running_loop(), EventLoop.UVLOOP) is uvloop.Loop


def test_the_standard_loop_runs_when_asked() -> None:
    assert Settings(event_loop="asyncio").event_loop is EventLoop.ASYNCIO
    loop_type = event_loop.run(_running_loop(), EventLoop.ASYNCIO)
    assert loop_type is not uvloop.Loop and issubclass(loop_type, asyncio.BaseEventLoop)
