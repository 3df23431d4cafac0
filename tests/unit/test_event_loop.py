"""The services' event loop follows VERSUS_EVENT_LOOP."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from common.config.settings import EventLoop, Settings, load_settings
from common.errors import ConfigError
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


def test_an_unknown_loop_is_a_configuration_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VERSUS_EVENT_LOOP", "tokio")
    with pytest.raises(ConfigError, match="VERSUS_EVENT_LOOP: Input should be 'uvloop' or 'asyncio'"):
        load_settings()
