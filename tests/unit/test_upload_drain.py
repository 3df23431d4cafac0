"""Reading the rest of a refused upload: to its end, but never past its byte or time bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from common.grpc import uploads


async def _stream(
    count: int, size: int = 10, pause_s: float = 0.0, breaks: bool = False
) -> AsyncIterator[bytes]:
    for _ in range(count):
        if pause_s:
            await asyncio.sleep(pause_s)
        yield b"x" * size
    if breaks:
        raise ConnectionError("the client went away")


async def test_the_rest_of_the_stream_is_read_to_its_end() -> None:
    assert await uploads.drain(_stream(7), len) == 70


async def test_reading_stops_past_the_byte_bound() -> None:
    stream = _stream(1000)
    assert await uploads.drain(stream, len, max_bytes=95) == 100
    assert len(await anext(stream)) == 10  # the rest is left unread


async def test_reading_stops_at_the_time_bound() -> None:
    started = asyncio.get_running_loop().time()
    dropped = await uploads.drain(_stream(1000, pause_s=0.05), len, max_s=0.2)
    assert asyncio.get_running_loop().time() - started < 1.0
    assert 0 < dropped < 1000 * 10


async def test_a_stream_that_breaks_ends_the_reading_quietly() -> None:
    assert await uploads.drain(_stream(3, breaks=True), len) == 30
