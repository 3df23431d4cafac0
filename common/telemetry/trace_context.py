"""W3C Trace Context, pure: the ``traceparent`` value that carries a trace between processes.

Trace context crosses every hop of a task — the platform's gRPC metadata, the router's rows, the
gateway's stream to the router, the claim answer to the collector and its report back — always
*beside* signed material, never inside it, and it is never trusted for anything: a value that is
not a well-formed ``traceparent`` is dropped (:func:`parse` answers None), it never fails a
request. Only version ``00`` is written; later versions are read as the specification says (the
first four fields, whatever follows).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

HEADER = "traceparent"

_V00 = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
# A later version may append fields after a dash; version ff is forbidden.
_LATER = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
MAX_LENGTH = 512  # nothing honest is longer; a bound before any regular expression runs
_SAMPLED = 0x01


@dataclass(frozen=True, slots=True)
class TraceParent:
    """One span's place in a trace: its trace id (128 bits), its span id (64 bits), and whether the
    trace is sampled (recorded) — the only flag this project acts on."""

    trace_id: int
    span_id: int
    sampled: bool

    def header(self) -> str:
        """The ``traceparent`` value (version 00)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    def child(self, span_id: int | None = None) -> TraceParent:
        """A span of the same trace (a new span id unless given)."""
        return TraceParent(self.trace_id, span_id or new_span_id(), self.sampled)

    @property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @property
    def span_hex(self) -> str:
        return f"{self.span_id:016x}"


def parse(value: object) -> TraceParent | None:
    """The trace context in ``value``, or None when it is absent or not well formed (all-zero ids,
    version ff, upper-case hex and wrong lengths included)."""
    if not isinstance(value, str) or not value or len(value) > MAX_LENGTH:
        return None
    match = _V00.match(value)
    if match is not None:
        trace_hex, span_hex, flags = match.groups()
    else:
        later = _LATER.match(value)
        if later is None or later.group(1) in ("00", "ff"):
            return None
        _, trace_hex, span_hex, flags, _rest = later.groups()
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, bool(int(flags, 16) & _SAMPLED))


def new_span_id() -> int:
    """A random, non-zero 64-bit span id."""
    while True:
        value = secrets.randbits(64)
        if value:
            return value


def new_trace_id() -> int:
    """A random, non-zero 128-bit trace id."""
    while True:
        value = secrets.randbits(128)
        if value:
            return value
