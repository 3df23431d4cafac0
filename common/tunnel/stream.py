"""One direction of a resumable tunnel leg, sans I/O: what was sent, what the peer has, what to resend.

A tunnel leg (the collector's socket to its gateway, or the platform's stream to it) carries an
ordered byte stream each way. Neither end numbers its data frames: both count bytes, so a data
frame costs nothing beyond its bytes. The half-close (``eof``) takes one place in that count, as
TCP's FIN takes a sequence number, so acknowledging it is acknowledging one offset more.

- The receiving end acknowledges the offset it has received up to, now and then
  (:class:`ReceiveCounter` says when: every ``ack_every`` bytes, and on a timer the adapter runs).
- The sending end keeps every byte not yet acknowledged (:class:`SendWindow`), at most ``limit``
  of them: a writer that would pass that waits for an acknowledgement (the bound on a session's
  memory, and the backpressure a slow reader puts on its writer).
- When a leg breaks, each end tells the other the offset it has received up to on its first frame
  of the new leg, and each resends from the offset it was told. Nothing is lost (everything not
  acknowledged is still kept) and nothing is doubled (the peer said where it is).

Offsets outside what an end can answer for mean the two ends do not share a history (a restarted
process, a foreign session): :class:`ResumeError` with a stable code, and the session ends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted


class ResumeError(FailedPrecondition):
    """An offset from the peer that this end's history cannot answer: the session cannot go on."""


class WindowFull(ResourceExhausted):
    """More bytes pushed than the window has room for: the adapter must wait for an acknowledgement."""

    default_code = "tunnel_window_full"


@dataclass(slots=True)
class SendWindow:
    """Bytes sent on one direction and not yet acknowledged, kept for a resumed leg.

    ``base`` is the offset of the first unacknowledged byte, ``end`` the offset after the last byte
    pushed (the eof included once :meth:`close` was called). ``end - base`` never exceeds ``limit``
    (the eof's place aside).
    """

    limit: int
    base: int = 0
    end: int = 0
    eof_at: int | None = None  # the offset the half-close takes, once closed
    # Views, so that a partial acknowledgement drops a chunk's head without copying its tail.
    _chunks: deque[memoryview] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.limit <= 0:
            raise InvalidArgument(
                "a send window needs room for at least one byte", code="tunnel_window_invalid"
            )

    @property
    def buffered(self) -> int:
        """Bytes kept for resending (the eof's place not counted)."""
        return self.end - self.base - (1 if self.eof_at is not None and self.eof_at >= self.base else 0)

    def room(self) -> int:
        """How many more bytes may be pushed before an acknowledgement frees some."""
        return 0 if self.eof_at is not None else self.limit - self.buffered

    def push(self, data: bytes) -> None:
        """Record ``data`` as sent (the adapter writes it to the leg, if one is up)."""
        if self.eof_at is not None:
            raise InvalidArgument("this direction is closed", code="tunnel_direction_closed")
        if len(data) > self.room():
            raise WindowFull(
                f"{len(data)} bytes do not fit the {self.room()} the send window has left",
                details={"room": self.room(), "limit": self.limit},
            )
        if data:
            self._chunks.append(memoryview(bytes(data)))
            self.end += len(data)

    def close(self) -> int:
        """Record the half-close; returns the offset it takes (its acknowledgement is one more)."""
        if self.eof_at is None:
            self.eof_at = self.end
            self.end += 1
        return self.eof_at

    def ack(self, offset: int) -> int:
        """The peer has everything before ``offset``: forget it. Returns the bytes freed.

        An acknowledgement older than one already applied is ignored (legs may overlap while one
        is replaced); one beyond what was sent is a peer that does not share this history.
        """
        if offset > self.end:
            raise ResumeError(
                f"acknowledged offset {offset} is past the {self.end} sent", code="tunnel_ack_out_of_range"
            )
        freed = 0
        while self.base < offset:
            if self.eof_at is not None and self.base == self.eof_at:
                self.base += 1
                break
            head = self._chunks[0]
            take = min(len(head), offset - self.base)
            if take == len(head):
                self._chunks.popleft()
            else:
                self._chunks[0] = head[take:]
            self.base += take
            freed += take
        return freed

    def resend_from(self, offset: int) -> tuple[list[bytes], bool]:
        """What to send again on a new leg whose peer has received up to ``offset``: the bytes
        from there on, and whether the eof must be sent again after them."""
        if offset > self.end:
            raise ResumeError(
                f"the peer says it has {offset} bytes but only {self.end} were sent",
                code="tunnel_resume_out_of_range",
            )
        if offset < self.base:
            raise ResumeError(
                f"the peer has only {offset} bytes but {self.base} were acknowledged and dropped",
                code="tunnel_resume_out_of_range",
            )
        self.ack(offset)
        eof = self.eof_at is not None and self.base <= self.eof_at
        return [bytes(chunk) for chunk in self._chunks], eof

    def since(self, offset: int) -> tuple[list[memoryview], bool]:
        """The bytes kept from ``offset`` on (views, not copies) and whether the eof follows them:
        what a leg that has sent up to ``offset`` sends next. Nothing is acknowledged by this."""
        if not self.base <= offset <= self.end:
            raise ResumeError(
                f"offset {offset} is outside the {self.base}-{self.end} kept",
                code="tunnel_resume_out_of_range",
            )
        views: list[memoryview] = []
        at = self.base
        for chunk in self._chunks:
            if at + len(chunk) > offset:
                views.append(chunk[max(0, offset - at) :])
            at += len(chunk)
        eof = self.eof_at is not None and offset <= self.eof_at
        return views, eof

    @property
    def done(self) -> bool:
        """Closed, and the peer acknowledged everything, the eof included."""
        return self.eof_at is not None and self.base == self.end


@dataclass(slots=True)
class ReceiveCounter:
    """Bytes received on one direction, and when to acknowledge them.

    An acknowledgement is due once ``ack_every`` bytes arrived since the last one (so a sender
    with a window of ``limit`` is never held up if ``ack_every`` is well under it), when the eof
    arrives, and whenever the adapter's timer asks for what is pending.
    """

    ack_every: int
    received: int = 0
    acked: int = 0
    eof: bool = False

    def __post_init__(self) -> None:
        if self.ack_every <= 0:
            raise InvalidArgument("acknowledgements need a positive interval", code="tunnel_window_invalid")

    def take(self, size: int) -> int | None:
        """``size`` bytes arrived; the offset to acknowledge now, if one is due."""
        if self.eof:
            raise ResumeError("data after this direction's eof", code="tunnel_data_after_eof")
        self.received += size
        return self._due(self.received - self.acked >= self.ack_every)

    def take_eof(self) -> int:
        """The peer half-closed; its acknowledgement is due at once."""
        if not self.eof:
            self.eof = True
            self.received += 1
        self.acked = self.received
        return self.received

    def pending(self) -> int | None:
        """The offset to acknowledge on a timer tick, if anything arrived since the last one."""
        return self._due(self.received > self.acked)

    def _due(self, due: bool) -> int | None:
        if not due:
            return None
        self.acked = self.received
        return self.received
