"""One end of a tunnel session's collector leg, on asyncio: a local party on one side, a socket
that may be replaced on the other.

The local party is the device connection (on the collector) or the platform's stream (on the
gateway); it calls :meth:`TunnelEnd.write`, :meth:`TunnelEnd.write_eof` and
:meth:`TunnelEnd.read`. The socket is a :class:`Leg`; :meth:`TunnelEnd.run_leg` carries the
session over one until it breaks or the session ends, and a later leg picks up where it stopped
(protocol 2). The byte accounting is :mod:`common.tunnel.stream`'s; this module adds the tasks.

Flow control, both directions (docs/gateway.md, "Tunnels"):

- A writer waits while its direction has :data:`WINDOW_BYTES` unacknowledged (protocol 2) or
  unsent (protocol 1) bytes: a reader that stops reading stops its writer, and the session's
  memory stays bounded.
- A leg is read all the time (protocol 2), so acknowledgements never wait behind data. Bytes are
  acknowledged once the local party has *taken* them, so what waits in :attr:`TunnelEnd.inbox` is
  at most the peer's window; a peer that sends past it breaks the protocol and ends the session.
- Protocol 1 has no acknowledgements: the leg is simply not read while the inbox is full, and the
  socket's own backpressure does the rest. A protocol-1 leg that breaks ends the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Protocol

from common.errors import VersusError
from common.tunnel import frames
from common.tunnel.stream import ReceiveCounter, SendWindow

# Bytes of one direction kept until acknowledged; also what the peer may have waiting here.
WINDOW_BYTES = 2 * 1024 * 1024
# Acknowledge after this many bytes were taken, and what is pending every ACK_INTERVAL_S.
ACK_EVERY_BYTES = 256 * 1024
ACK_INTERVAL_S = 0.25
# How long a session waits for its collector to dial back after its socket dropped.
RESUME_WINDOW_S = 30.0


class LegClosed(Exception):
    """The socket is gone. ``clean``: its peer closed it on purpose (close code 1000), with ``reason``."""

    def __init__(self, clean: bool = False, reason: str = ""):
        super().__init__(reason or ("closed" if clean else "dropped"))
        self.clean = clean
        self.reason = reason


class SessionEnded(Exception):
    """The session is over; ``reason`` is its stable code."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Leg(Protocol):
    """A tunnel socket as the end sees it: whole messages, binary or text."""

    async def send(self, message: bytes | str) -> None:
        """Send one frame; raises :class:`LegClosed` if the socket is gone."""

    async def receive(self) -> bytes | str:
        """The next frame; raises :class:`LegClosed` when the socket is gone."""


def _payload(view: memoryview) -> bytes:
    """The bytes of ``view``, without a copy when it covers a whole ``bytes`` object."""
    whole = view.obj
    return whole if isinstance(whole, bytes) and len(whole) == len(view) else bytes(view)


class TunnelEnd:
    """This end of one session: the outgoing window, the incoming inbox, and the legs' tasks."""

    def __init__(
        self,
        version: int,
        *,
        window: int = WINDOW_BYTES,
        ack_every: int = ACK_EVERY_BYTES,
        ack_interval_s: float = ACK_INTERVAL_S,
    ):
        self.version = version
        self.max_frame = frames.MAX_FRAME_BYTES[version]
        self.window = window
        self.ack_interval_s = ack_interval_s
        self.out = SendWindow(window)
        self.taken = ReceiveCounter(ack_every)  # bytes the local party took (what is acknowledged)
        self.received = 0  # bytes from the peer, the eof included, taken or not (what a resume names)
        self.inbox: deque[bytes | None] = deque()  # None: the peer's eof
        self.inbox_bytes = 0
        self.eof_read = False
        self.peer_eof = False  # the peer's eof arrived (taken or not)
        self.reason = ""
        self.ended = asyncio.Event()
        self.opened = asyncio.Event()  # a leg completed its opening exchange once
        self.legs = 0
        self.last_activity = time.monotonic()
        self._ack_due: int | None = None
        # The leg carrying the session now, and the offset its sending has reached. One flush at a
        # time sends on it: the sender task's, or the writer's own when the sender is idle (a
        # frame then leaves without waking a task: one turn of the loop less per hop).
        self._leg: Leg | None = None
        self._sent_upto = 0
        self._flushing = False
        self._room = asyncio.Event()  # the window may have room again
        self._arrived = asyncio.Event()  # the inbox got something
        self._drained = asyncio.Event()  # the inbox shrank (protocol 1 reads on)
        self._wake = asyncio.Event()  # the sender has something to do

    # --- the session -------------------------------------------------------------------------

    def end(self, reason: str) -> None:
        """End the session with ``reason`` (the first reason given stands) and wake every waiter."""
        if not self.ended.is_set():
            self.reason = reason
            self.ended.set()
        for event in (self._room, self._arrived, self._drained, self._wake):
            event.set()

    @property
    def finished(self) -> bool:
        """Both directions closed: this end's eof acknowledged and the peer's taken."""
        return self.out.done and self.eof_read

    def _check_finished(self) -> None:
        if self.finished:
            self.end("done")

    def _raise_if_ended(self) -> None:
        if self.ended.is_set():
            raise SessionEnded(self.reason)

    # --- the local party ---------------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Send ``data`` toward the peer in frames the leg allows, waiting while the window is full."""
        view = memoryview(data)
        for start in range(0, len(view), self.max_frame):
            piece = data if len(data) <= self.max_frame else bytes(view[start : start + self.max_frame])
            while self.out.room() < len(piece):
                self._raise_if_ended()
                self._room.clear()
                await self._room.wait()
            self._raise_if_ended()
            self.out.push(piece)
            self.last_activity = time.monotonic()
            await self._send_now()

    async def _send_now(self) -> None:
        """Send what is pending from the writer's own task if no flush runs, else wake the sender."""
        leg = self._leg
        if leg is None or self._flushing:
            self._wake.set()
            return
        self._flushing = True
        try:
            await self._flush(leg)
        except LegClosed:
            pass  # the leg's receiver notices too; the next leg resends what did not arrive
        finally:
            self._flushing = False
            self._wake.set()

    def write_eof(self) -> None:
        """The local party will send no more (half-close)."""
        if not self.ended.is_set():
            self.out.close()
            self._wake.set()

    async def read(self) -> bytes | None:
        """The peer's next bytes, or None once it half-closed; raises :class:`SessionEnded` when the
        session is over (after what arrived before that was taken)."""
        while not self.inbox:
            self._raise_if_ended()
            self._arrived.clear()
            await self._arrived.wait()
        chunk = self.inbox.popleft()
        if chunk is None:
            self.eof_read = True
            self._acknowledge(self.taken.take_eof())
            self._check_finished()
            return None
        self.inbox_bytes -= len(chunk)
        self._drained.set()
        self._acknowledge(self.taken.take(len(chunk)))
        return chunk

    def _acknowledge(self, offset: int | None) -> None:
        if offset is not None and self.version >= frames.V2:
            self._ack_due = offset
            self._wake.set()

    # --- a leg -------------------------------------------------------------------------------

    async def run_leg(self, leg: Leg) -> LegClosed | None:
        """Carry the session over ``leg`` until it breaks (returns how) or the session ends (None).

        Protocol 2 opens with the resume exchange: each end names what it has received, and
        sends from what the other named. The caller closes the socket afterwards.
        """
        self.legs += 1
        try:
            sent = await self._open(leg)
        except LegClosed as closed:
            return closed
        except VersusError as exc:  # a peer that does not share this session's history
            self.end(exc.code)
            return None
        if sent is None:
            return None
        self.opened.set()
        self._leg, self._sent_upto = leg, sent
        sender = asyncio.create_task(self._send_loop(leg))
        receiver = asyncio.create_task(self._receive_loop(leg))
        ended = asyncio.create_task(self.ended.wait())
        try:
            await asyncio.wait({sender, receiver, ended}, return_when=asyncio.FIRST_COMPLETED)
            if ended.done() and not sender.done():
                # Acknowledgements still due (the peer's eof, taken just now) leave before the close.
                await asyncio.wait({sender}, timeout=1.0)
        finally:
            if self._leg is leg:
                self._leg = None
            for task in (sender, receiver, ended):
                task.cancel()
            results = await asyncio.gather(sender, receiver, ended, return_exceptions=True)
        if self.ended.is_set():
            return None
        broke = [r for r in results if isinstance(r, LegClosed)]
        return broke[0] if broke else LegClosed()

    async def _open(self, leg: Leg) -> int | None:
        """The offset this leg's sending starts from, or None if the session ended meanwhile."""
        if self.version < frames.V2:
            return self.out.base
        # The peer may have said its last already (an error frame): read it even if this fails.
        with contextlib.suppress(LegClosed):
            await leg.send(frames.resume(self.received))
        first = await leg.receive()
        if not isinstance(first, str):
            self.end("tunnel_frame_invalid")
            return None
        control = frames.parse_control(first, self.version)
        if control.kind == "error":  # the collector could not reach the device
            self.end(control.reason)
            return None
        if control.kind != "resume":
            self.end("tunnel_frame_invalid")
            return None
        # Resending starts where the peer is: it must be among what this end still keeps.
        self.out.resend_from(control.offset)
        self._room.set()
        self._check_finished()
        return None if self.ended.is_set() else control.offset

    async def _send_loop(self, leg: Leg) -> None:
        while True:
            self._wake.clear()
            if not self._flushing:
                self._flushing = True
                try:
                    await self._flush(leg)
                finally:
                    self._flushing = False
                if self.ended.is_set() and self._ack_due is None:
                    return
            await self._idle()

    async def _flush(self, leg: Leg) -> None:
        """Send on ``leg`` what is due: an acknowledgement first, then data and the eof, until
        nothing is left (or the session ended, or another leg replaced this one: a send that
        completes on a replaced leg must not move the new leg's offset)."""
        while self._leg is leg:
            if self._ack_due is not None:
                offset, self._ack_due = self._ack_due, None
                await leg.send(frames.ack(offset))
                continue
            if self.ended.is_set():
                return
            views, eof = self.out.since(self._sent_upto)
            for view in views:
                await leg.send(_payload(view))
                if self._leg is not leg:
                    return
                self._sent_upto += len(view)
                self._sent(self._sent_upto)
                if self._ack_waiting():
                    break  # an acknowledgement does not wait behind a long resend
            if views:
                continue
            if not eof:
                return
            await leg.send(frames.EOF)
            if self._leg is not leg:
                return
            self._sent_upto += 1
            self._sent(self._sent_upto)
            self._check_finished()

    def _ack_waiting(self) -> bool:
        return self._ack_due is not None

    def _sent(self, offset: int) -> None:
        if self.version < frames.V2:  # no acknowledgements: what the socket took is done with
            self.out.ack(offset)
            self._room.set()

    async def _idle(self) -> None:
        """Wait for something to send; on protocol 2, acknowledge what is pending now and then."""
        if self.version < frames.V2:
            await self._wake.wait()
            return
        try:
            async with asyncio.timeout(self.ack_interval_s):
                await self._wake.wait()
        except TimeoutError:
            self._ack_due = self.taken.pending()

    async def _receive_loop(self, leg: Leg) -> None:
        try:
            while not self.ended.is_set():
                while self.version < frames.V2 and self.inbox_bytes >= self.window:
                    self._drained.clear()
                    await self._drained.wait()
                    if self.ended.is_set():
                        return
                message = await leg.receive()
                if isinstance(message, bytes):
                    self._take_data(message)
                else:
                    self._take_control(frames.parse_control(message, self.version))
        except VersusError as exc:  # a malformed frame, an acknowledgement out of range
            self.end(exc.code)

    def _take_data(self, data: bytes) -> None:
        if len(data) > self.max_frame:
            self.end("frame_too_large")
        elif self.peer_eof:
            self.end("tunnel_data_after_eof")
        elif data:
            self.received += len(data)
            self.inbox.append(data)
            self.inbox_bytes += len(data)
            self.last_activity = time.monotonic()
            self._arrived.set()
            if self.version >= frames.V2 and self.inbox_bytes > self.window:
                self.end("tunnel_window_exceeded")

    def _take_control(self, control: frames.Control) -> None:
        if control.kind == "eof":
            if not self.peer_eof:
                self.peer_eof = True
                self.received += 1
                self.inbox.append(None)
                self._arrived.set()
        elif control.kind == "error":
            self.end(control.reason)
        elif control.kind == "ack":
            self.out.ack(control.offset)
            self._room.set()
            self._check_finished()
        else:  # a resume is only ever a leg's first frame
            self.end("tunnel_frame_invalid")
