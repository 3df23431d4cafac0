"""Two tunnel ends (common/tunnel/end.py) over in-memory legs: flow, half-close, resume, bounds.

The legs are queues: what one end sends the other receives, in order, until the test breaks
the pair (both ends then see the leg gone, and whatever was in flight is lost, as on a reset).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from common.tunnel import frames
from common.tunnel.end import LegClosed, SessionEnded, TunnelEnd

pytestmark = pytest.mark.timeout(20)


class MemoryLeg:
    def __init__(self, inbox: asyncio.Queue[bytes | str | None], outbox: asyncio.Queue[bytes | str | None]):
        self.inbox, self.outbox = inbox, outbox
        self.broken = False
        self.sent_bytes = 0
        self.texts: list[str] = []
        self.progress = asyncio.Event()  # set on every send

    async def send(self, message: bytes | str) -> None:
        if self.broken:
            raise LegClosed()
        self.progress.set()
        if isinstance(message, bytes):
            self.sent_bytes += len(message)
        else:
            self.texts.append(message)
        await self.outbox.put(message)

    async def receive(self) -> bytes | str:
        message = await self.inbox.get()
        if message is None or self.broken:
            raise LegClosed()
        return message


def leg_pair(depth: int = 0) -> tuple[MemoryLeg, MemoryLeg]:
    """Two connected legs; ``depth`` bounds each direction's queue (0: unbounded)."""
    a_to_b: asyncio.Queue[bytes | str | None] = asyncio.Queue(depth)
    b_to_a: asyncio.Queue[bytes | str | None] = asyncio.Queue(depth)
    return MemoryLeg(b_to_a, a_to_b), MemoryLeg(a_to_b, b_to_a)


def cut(pair: tuple[MemoryLeg, MemoryLeg]) -> None:
    """A reset: both ends lose the leg and what was in flight on it."""
    for leg in pair:
        leg.broken = True
        while not leg.inbox.empty():
            leg.inbox.get_nowait()
        leg.inbox.put_nowait(None)


async def read_all(end: TunnelEnd) -> bytes:
    got = bytearray()
    while (chunk := await end.read()) is not None:
        got += chunk
    return bytes(got)


async def write_all(end: TunnelEnd, data: bytes, piece: int) -> None:
    for start in range(0, len(data), piece):
        await end.write(data[start : start + piece])
    end.write_eof()


async def test_bytes_flow_both_ways_and_both_half_closes_end_the_session_as_done() -> None:
    gateway, collector = TunnelEnd(frames.V2), TunnelEnd(frames.V2)
    pair = leg_pair()
    legs = [asyncio.create_task(gateway.run_leg(pair[0])), asyncio.create_task(collector.run_leg(pair[1]))]
    up, down = os.urandom(3_000_000), os.urandom(1_500_000)
    results = await asyncio.gather(
        write_all(gateway, down, 700_000), write_all(collector, up, 1_100_000),
        read_all(collector), read_all(gateway),
    )  # fmt: skip
    assert results[2] == down and results[3] == up
    assert await asyncio.gather(*legs) == [None, None]
    assert (gateway.reason, collector.reason) == ("done", "done")
    # Frames never exceed the protocol's largest.
    assert collector.max_frame == 1024 * 1024


@pytest.mark.parametrize("cut_after", [1, 65_536, 300_000, 700_000, 1_100_000, 1_600_000, 2_000_000])
async def test_a_cut_leg_resumes_on_a_new_one_with_nothing_lost_or_doubled(cut_after: int) -> None:
    gateway, collector = TunnelEnd(frames.V2), TunnelEnd(frames.V2)
    data_down, data_up = os.urandom(3_000_000), os.urandom(2_000_000)
    reading = asyncio.gather(read_all(collector), read_all(gateway))
    writing = asyncio.gather(write_all(gateway, data_down, 65_536), write_all(collector, data_up, 300_000))
    first = leg_pair(depth=8)
    legs = [asyncio.create_task(gateway.run_leg(first[0])), asyncio.create_task(collector.run_leg(first[1]))]
    while first[0].sent_bytes < cut_after:
        first[0].progress.clear()
        await first[0].progress.wait()
    cut(first)
    broke = await asyncio.gather(*legs)
    assert all(isinstance(b, LegClosed) for b in broke), (broke, gateway.reason, collector.reason)
    second = leg_pair()
    legs = [
        asyncio.create_task(end.run_leg(leg)) for end, leg in zip((gateway, collector), second, strict=True)
    ]
    down, up = await reading
    await writing
    assert (down, up) == (data_down, data_up)
    assert await asyncio.gather(*legs) == [None, None]
    assert gateway.legs == collector.legs == 2
    # Each opened its second leg naming what it had received (the other resent from there).
    assert second[0].texts[0].startswith("resume:") and second[1].texts[0].startswith("resume:")


async def test_a_reader_that_stops_stops_its_writer_at_the_window() -> None:
    window = 256 * 1024
    gateway, collector = TunnelEnd(frames.V2, window=window), TunnelEnd(frames.V2, window=window)
    pair = leg_pair()
    legs = [asyncio.create_task(gateway.run_leg(pair[0])), asyncio.create_task(collector.run_leg(pair[1]))]
    writer = asyncio.create_task(write_all(gateway, os.urandom(4 * window), 64 * 1024))
    await asyncio.sleep(0.2)
    assert not writer.done()  # the collector's side takes nothing: the gateway's writer waits
    assert gateway.out.buffered <= window
    assert collector.inbox_bytes <= window
    taken = 0
    while taken < 4 * window:
        taken += len(await collector.read() or b"")
    await writer
    gateway.end("done")
    collector.end("done")
    await asyncio.gather(*legs)


async def test_a_peer_that_ignores_the_window_ends_the_session() -> None:
    collector = TunnelEnd(frames.V2, window=1024)
    pair = leg_pair()
    leg = asyncio.create_task(collector.run_leg(pair[1]))
    await pair[0].send(frames.resume(0))
    await pair[0].send(b"x" * 1000)
    await pair[0].send(b"y" * 1000)  # nothing was taken or acknowledged: past the window
    assert await leg is None
    assert collector.reason == "tunnel_window_exceeded"


async def test_protocol_1_has_no_acknowledgements_and_ends_with_its_leg() -> None:
    gateway, collector = TunnelEnd(frames.V1), TunnelEnd(frames.V1)
    pair = leg_pair()
    legs = [asyncio.create_task(gateway.run_leg(pair[0])), asyncio.create_task(collector.run_leg(pair[1]))]
    await gateway.write(b"a" * 200_000)  # frames of at most 64 KiB
    assert [len(await collector.read() or b"") for _ in range(4)] == [65536, 65536, 65536, 3392]
    cut(pair)
    assert all(isinstance(b, LegClosed) for b in await asyncio.gather(*legs))
    assert pair[0].texts == pair[1].texts == []  # no resume, no acknowledgements


async def test_a_resume_from_an_offset_this_end_never_sent_ends_the_session() -> None:
    gateway = TunnelEnd(frames.V2)
    pair = leg_pair()
    leg = asyncio.create_task(gateway.run_leg(pair[0]))
    await pair[1].send(frames.resume(5))  # the peer claims five bytes nobody sent
    assert await leg is None
    assert gateway.reason == "tunnel_resume_out_of_range"
    with pytest.raises(SessionEnded):
        await gateway.read()


async def test_an_error_as_the_first_frame_ends_the_session_with_its_reason() -> None:
    gateway = TunnelEnd(frames.V2)
    pair = leg_pair()
    leg = asyncio.create_task(gateway.run_leg(pair[0]))
    await pair[1].send(frames.error("target_unreachable"))
    assert await leg is None
    assert (gateway.reason, gateway.opened.is_set()) == ("target_unreachable", False)


async def test_versus_cp_joins_queued_stdin_reads_but_never_past_one_frame() -> None:
    from versus_cp.tunnel_cmd import CHUNK_BYTES, _coalesced

    chunks: asyncio.Queue[bytes] = asyncio.Queue()
    for size in (400_000, 400_000, 400_000, 10):
        chunks.put_nowait(b"x" * size)
    chunks.put_nowait(b"")
    frames_sent, more = [], True
    while more:
        frame, more = _coalesced(chunks, chunks.get_nowait())
        if frame:
            frames_sent.append(len(frame))
    assert frames_sent == [800_000, 400_010]
    assert all(size <= CHUNK_BYTES for size in frames_sent)
