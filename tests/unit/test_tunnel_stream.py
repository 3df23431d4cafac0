"""The resumable tunnel leg's core (common/tunnel/stream.py, frames.py), fed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import InvalidArgument
from common.tunnel import frames
from common.tunnel.stream import ReceiveCounter, ResumeError, SendWindow, WindowFull


def test_the_window_holds_what_is_unacknowledged_and_refuses_past_its_limit() -> None:
    window = SendWindow(limit=10)
    window.push(b"abcd")
    window.push(b"efgh")
    assert (window.base, window.end, window.buffered, window.room()) == (0, 8, 8, 2)
    with pytest.raises(WindowFull) as refused:
        window.push(b"ijk")
    assert refused.value.code == "tunnel_window_full"
    assert window.end == 8  # nothing of the refused push was taken
    assert window.ack(6) == 6
    assert (window.base, window.buffered, window.room()) == (6, 2, 8)
    window.push(b"ijk")
    assert window.resend_from(6) == ([b"gh", b"ijk"], False)


def test_an_old_acknowledgement_is_ignored_and_one_past_the_end_is_refused() -> None:
    window = SendWindow(limit=100)
    window.push(b"0123456789")
    window.ack(7)
    assert window.ack(3) == 0
    assert window.base == 7
    with pytest.raises(ResumeError) as refused:
        window.ack(11)
    assert refused.value.code == "tunnel_ack_out_of_range"


def test_a_resume_from_before_what_was_dropped_or_past_what_was_sent_is_refused() -> None:
    window = SendWindow(limit=100)
    window.push(b"0123456789")
    window.ack(5)
    for offset in (4, 11):
        with pytest.raises(ResumeError) as refused:
            window.resend_from(offset)
        assert refused.value.code == "tunnel_resume_out_of_range"
    assert window.resend_from(10) == ([], False)


def test_the_eof_takes_one_offset_and_is_resent_until_acknowledged() -> None:
    window = SendWindow(limit=100)
    window.push(b"abc")
    assert window.close() == 3
    assert window.close() == 3  # once
    assert window.room() == 0
    with pytest.raises(InvalidArgument) as refused:
        window.push(b"d")
    assert refused.value.code == "tunnel_direction_closed"
    assert window.resend_from(2) == ([b"c"], True)
    assert window.resend_from(3) == ([], True)
    done_before = window.done
    window.ack(4)
    assert (done_before, window.done) == (False, True)
    assert window.resend_from(4) == ([], False)


def test_acknowledgements_are_due_every_so_many_bytes_at_eof_and_on_a_tick() -> None:
    counter = ReceiveCounter(ack_every=100)
    assert counter.take(60) is None
    assert counter.take(60) == 120
    assert counter.pending() is None
    assert counter.take(10) is None
    assert counter.pending() == 130
    assert counter.take_eof() == 131
    with pytest.raises(ResumeError) as refused:
        counter.take(1)
    assert refused.value.code == "tunnel_data_after_eof"


@pytest.mark.parametrize(
    ("text", "version", "expected"),
    [
        ("eof", 1, frames.Control("eof")),
        ("error:target_unreachable", 1, frames.Control("error", reason="target_unreachable")),
        ("ack:0", 2, frames.Control("ack", offset=0)),
        ("ack:1048576", 2, frames.Control("ack", offset=1048576)),
        ("resume:9223372036854775807", 2, frames.Control("resume", offset=2**63 - 1)),
    ],
)
def test_control_frames_read(text: str, version: int, expected: frames.Control) -> None:
    assert frames.parse_control(text, version) == expected


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("ack:5", 1),  # version 1 has no acknowledgements
        ("resume:0", 1),
        ("ack:", 2),
        ("ack:-1", 2),
        ("ack:007", 2),
        ("ack:1e3", 2),
        ("ack:9223372036854775808", 2),
        ("resume: 5", 2),
        ("error:", 2),
        ("error:Target Unreachable", 2),
        ("error:" + "x" * 65, 2),
        ("EOF", 2),
        ("hello", 2),
    ],
)
def test_anything_else_is_an_invalid_frame(text: str, version: int) -> None:
    with pytest.raises(InvalidArgument) as refused:
        frames.parse_control(text, version)
    assert refused.value.code == "tunnel_frame_invalid"


def test_frames_written_are_read_back_and_versions_settle_on_the_lower() -> None:
    assert frames.parse_control(frames.ack(42), 2) == frames.Control("ack", offset=42)
    assert frames.parse_control(frames.resume(0), 2) == frames.Control("resume", offset=0)
    assert frames.parse_control(frames.error("target_unreachable"), 1).reason == "target_unreachable"
    assert (frames.negotiate(1), frames.negotiate(2), frames.negotiate(9)) == (1, 2, 2)
    with pytest.raises(InvalidArgument):
        frames.negotiate(0)
    for bad in (lambda: SendWindow(limit=0), lambda: ReceiveCounter(ack_every=0)):
        with pytest.raises(InvalidArgument) as refused:
            bad()
        assert refused.value.code == "tunnel_window_invalid"
    assert frames.MAX_FRAME_BYTES == {1: 64 * 1024, 2: 1024 * 1024}


# A session's life as the two ends see it: a writer pushing through its window, a reader
# acknowledging, and legs that break with frames in flight lost; each break is followed by the
# resume exchange. Whatever the schedule, the reader ends with exactly the bytes written.
_STEP = st.one_of(
    st.tuples(st.just("write"), st.integers(1, 300)),
    st.tuples(st.just("deliver"), st.integers(1, 8)),
    st.tuples(st.just("tick"), st.just(0)),
    st.tuples(st.just("break"), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_STEP, max_size=120), limit=st.integers(1, 700), ack_every=st.integers(1, 400))
def test_any_schedule_of_breaks_delivers_every_byte_once_in_order(
    steps: list[tuple[str, int]], limit: int, ack_every: int
) -> None:
    window = SendWindow(limit=limit)
    counter = ReceiveCounter(ack_every=ack_every)
    written = bytearray()
    read = bytearray()
    wire: list[bytes | None] = []  # data frames toward the reader; None is the eof
    acks: list[int] = []  # acknowledgements toward the writer
    next_byte = 0

    def send(data: bytes) -> None:
        window.push(data)
        wire.append(data)

    def deliver(frames_to_take: int) -> None:
        for _ in range(min(frames_to_take, len(wire))):
            frame = wire.pop(0)
            if frame is None:
                acks.append(counter.take_eof())
                continue
            read.extend(frame)
            due = counter.take(len(frame))
            if due is not None:
                acks.append(due)
        while acks:
            window.ack(acks.pop(0))

    for kind, size in [*steps, ("finish", 0)]:
        if kind == "write":
            size = min(size, window.room())
            if size:
                data = bytes((next_byte + i) % 251 for i in range(size))
                next_byte += size
                written.extend(data)
                send(data)
            assert window.buffered <= limit
        elif kind == "deliver":
            deliver(size)
        elif kind == "tick":
            if (due := counter.pending()) is not None:
                acks.append(due)
        elif kind == "break":
            # Frames and acknowledgements in flight are lost; the reader says what it has.
            wire.clear()
            acks.clear()
            chunks, eof = window.resend_from(counter.received)
            wire.extend(chunks)
            if eof:
                wire.append(None)
        else:
            window.close()
            wire.append(None)
            while not window.done:
                deliver(len(wire) or 1)
                if not window.done and not wire:  # the last acknowledgement was lost: resume
                    chunks, eof = window.resend_from(counter.received)
                    wire.extend(chunks)
                    if eof:
                        wire.append(None)
    assert bytes(read) == bytes(written)
    assert counter.eof and counter.received == len(written) + 1


VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "tunnel"


@pytest.mark.parametrize("version", [1, 2])
def test_golden_control_frames_read_as_the_vectors_say(version: int) -> None:
    vector = json.loads((VECTORS / f"v{version}.json").read_text())
    assert vector["version"] == version
    assert vector["max_frame_bytes"] == frames.MAX_FRAME_BYTES[version]
    for case in vector["control_frames"]:
        expect = case["expect"]
        if isinstance(expect, str):
            with pytest.raises(InvalidArgument) as refused:
                frames.parse_control(case["frame"], version)
            assert refused.value.code == expect, case["name"]
        else:
            parsed = frames.parse_control(case["frame"], version)
            assert parsed == frames.Control(
                expect["kind"], expect.get("offset", 0), expect.get("reason", "")
            ), case["name"]


def test_the_golden_resumed_direction_is_what_both_ends_compute() -> None:
    script = json.loads((VECTORS / "v2.json").read_text())["resumed_direction"]
    window = SendWindow(limit=script["window_bytes"])
    counter = ReceiveCounter(ack_every=script["ack_every_bytes"])
    held = bytearray()
    for leg in script["legs"]:
        wire: list[bytes | None] = []
        if "reader_sends_first" in leg:
            assert leg["reader_sends_first"] == frames.resume(counter.received)
            offset = frames.parse_control(leg["reader_sends_first"], 2).offset
            chunks, eof = window.resend_from(offset)
            assert [c.hex() for c in chunks] == [f["data_hex"] for f in leg["writer_resends"]]
            wire.extend(chunks)
            assert not eof
        for frame in leg["sent"]:
            if frame.get("eof"):
                window.close()
                wire.append(None)
            else:
                data = bytes.fromhex(frame["data_hex"])
                window.push(data)
                wire.append(data)
        sent_acks = []
        for frame in wire[: leg["delivered_frames"]]:
            if frame is None:
                sent_acks.append(frames.ack(counter.take_eof()))
                continue
            held.extend(frame)
            if (due := counter.take(len(frame))) is not None:
                sent_acks.append(frames.ack(due))
        assert sent_acks == leg["reader_sends"]
        for text in sent_acks:
            window.ack(frames.parse_control(text, 2).offset)
    assert held.hex() == script["reader_has_hex"]
    assert window.done
