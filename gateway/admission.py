"""Admission at the gateway's listener: which accepted connections get a TLS handshake now, which
wait for one, and which are shed — decided before any TLS is spent (docs/gateway.md, "Storms").

A TLS handshake is the most expensive thing a connection costs the gateway (key exchange and a
signature, milliseconds of CPU in this process), and a storm — every collector of a restarted
gateway reconnecting at once — asks for thousands of them together. Handshakes started beyond
what the process can finish within the handshake timeout are lost twice: the CPU they took, and
the retry their client makes. So the listener accepts every connection the kernel has (a full
listen queue makes the kernel drop the client's packets, and TCP's retransmission timers then
stretch each handshake by seconds), and then:

- starts at most ``max_handshakes`` handshakes at once;
- holds the connections beyond that, unread, in arrival order (``max_waiting`` of them): the
  client's hello waits in the socket, and the handshake starts as soon as a slot frees;
- sheds, with a reset and before any TLS, a connection that finds the waiting line full, one
  that waited longer than ``max_wait_s`` (its client has likely given up), and one accepted at
  the connection limit. The client backs off and comes back (docs/collector.md);
- runs fewer handshakes while the event loop is late (:class:`HandshakeBudget`): a loop that is
  behind is behind with every admitted collector's claim answer too, so new connections wait
  (and are shed after ``max_wait_s``) rather than take the CPU those answers need.

This module is the bookkeeping, free of I/O and generic in what it holds (the listener holds
sockets, tests hold names); ``gateway/listener.py`` is the asyncio side.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# TLS handshakes in progress at once: enough to keep a core busy while some wait on the network.
MAX_HANDSHAKES = 64
# Connections waiting for a handshake slot, and how long one may wait: about what a collector's
# handshake timeout allows (10 s); a longer wait would start handshakes nobody waits for.
MAX_WAITING = 4096
MAX_WAIT_S = 8.0
# The event loop's lateness above which handshakes are cut back, the fewest kept running (a
# handshake also waits on the network: a few keep new collectors coming in on a busy loop), and
# how much of the bound comes back per calm sample (all of it within 16 samples).
LAG_TARGET_S = 0.05
MIN_HANDSHAKES = 4
RECOVERY_STEPS = 16


class Shed(enum.Enum):
    """Why a connection was closed before its handshake (the metric's label)."""

    CONNECTION_LIMIT = "connection_limit"
    LINE_FULL = "handshake_line_full"
    WAITED_TOO_LONG = "handshake_wait_too_long"


START = "start"
WAIT = "wait"


@dataclass(frozen=True)
class AdmissionLimits:
    """The listener's bounds (``VERSUS_GATEWAY_MAX_HANDSHAKES``; the connection limit of server.py)."""

    max_handshakes: int = MAX_HANDSHAKES
    max_waiting: int = MAX_WAITING
    max_wait_s: float = MAX_WAIT_S
    max_connections: int = 15_000

    def __post_init__(self) -> None:
        if self.max_handshakes < 1 or self.max_connections < 1 or self.max_waiting < 0:
            raise ValueError("admission limits must be at least 1 (the waiting line at least 0)")
        if self.max_wait_s <= 0:
            raise ValueError("the longest wait for a handshake must be above 0")


class HandshakeBudget:
    """How many handshakes may run at once: the configured bound while the event loop keeps time,
    halved at each sample that finds it later than ``target_s`` (down to ``floor``), and grown back
    by a sixteenth of the bound at each sample that does not (additive increase, multiplicative
    decrease, as TCP does with its window)."""

    def __init__(self, ceiling: int, floor: int = MIN_HANDSHAKES, target_s: float = LAG_TARGET_S) -> None:
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.target_s = target_s
        self.limit = ceiling

    def observe(self, lag_s: float) -> int:
        """One sample of the loop's lateness; the limit from now on."""
        if lag_s > self.target_s:
            self.limit = max(self.floor, self.limit // 2)
        else:
            self.limit = min(self.ceiling, self.limit + max(1, self.ceiling // RECOVERY_STEPS))
        return self.limit


class Admission(Generic[T]):
    """Handshakes in progress and the line waiting for them; one per listening process."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self.budget = HandshakeBudget(limits.max_handshakes)
        self.handshaking = 0
        self._line: deque[tuple[float, T]] = deque()
        # Connections closed before their handshake, by reason (also exported as a metric).
        self.shed: dict[Shed, int] = {}

    @property
    def waiting(self) -> int:
        return len(self._line)

    def arrive(self, item: T, connections: int, now: float) -> str | Shed:
        """``item`` was accepted while ``connections`` others are open (handshakes done):
        :data:`START` its handshake now (counted until :meth:`ended`), :data:`WAIT` (held here
        until :meth:`ended` hands it out), or the :class:`Shed` reason to close it unanswered."""
        if connections + self.handshaking + len(self._line) >= self.limits.max_connections:
            return self._shed(Shed.CONNECTION_LIMIT)
        if self.handshaking < self.budget.limit:
            self.handshaking += 1
            return START
        if len(self._line) >= self.limits.max_waiting:
            return self._shed(Shed.LINE_FULL)
        self._line.append((now, item))
        return WAIT

    def ended(self, now: float) -> tuple[T | None, list[T]]:
        """A handshake finished, failed or timed out: the waiting item to start in its place (or
        None: none waits, or the budget shrank), and those that waited too long, to shed."""
        if self.handshaking <= 0:
            raise RuntimeError("a handshake ended that was never started")
        self.handshaking -= 1
        # One slot freed, and the line is always started up to the budget: at most one starts.
        started, stale = self._next(now)
        return (started[0] if started else None), stale

    def observe(self, lag_s: float, now: float) -> tuple[list[T], list[T]]:
        """One sample of the event loop's lateness: the waiting items to start now (the budget
        grew), and those that waited too long, to shed."""
        self.budget.observe(lag_s)
        return self._next(now)

    def _next(self, now: float) -> tuple[list[T], list[T]]:
        """From the head of the line: those that waited too long, shed; then as many as the budget
        has room for, started."""
        started: list[T] = []
        stale: list[T] = []
        while self._line:
            since, item = self._line[0]
            if now - since > self.limits.max_wait_s:
                self._line.popleft()
                self._shed(Shed.WAITED_TOO_LONG)
                stale.append(item)
            elif self.handshaking < self.budget.limit:
                self._line.popleft()
                self.handshaking += 1
                started.append(item)
            else:
                break
        return started, stale

    def drain(self) -> list[T]:
        """Everything still waiting (the listener is closing)."""
        items = [item for _, item in self._line]
        self._line.clear()
        return items

    def _shed(self, reason: Shed) -> Shed:
        self.shed[reason] = self.shed.get(reason, 0) + 1
        return reason
