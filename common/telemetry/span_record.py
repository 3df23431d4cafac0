"""The collector's spans for one task, pure: recorded in the collector, carried home with its report.

A collector only ever dials out to its gateway, so it exports nothing itself: the spans it records
for a task (its verification, the driver's run, the local reconcile-read) travel in the report's
``trace`` member and the gateway exports them under the collector's own resource
(docs/operations.md, "Tracing"). They are recorded only when the claim answer handed the task out
with a *sampled* ``traceparent``; otherwise nothing is recorded and the report carries no trace.

The wire form, and the limits the gateway holds it to::

    {"traceparent": "00-<trace>-<span>-01",          # the collector's task span
     "spans": [{"name": "versus.collector.execute", "span_id": "<16 hex>", "parent_id": "<16 hex>",
                "start_ns": 1767225600000000000, "end_ns": 1767225600100000000,
                "status": "ok" | "error", "attributes": {"key": "str" | int | bool}}]}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from common.telemetry.trace_context import TraceParent, new_span_id

MAX_SPANS = 32
MAX_ATTRIBUTES = 16
MAX_ATTRIBUTE_KEY = 64
MAX_ATTRIBUTE_TEXT = 256
SPAN_NAME_PATTERN = r"^versus\.collector\.[a-z_.]{1,48}$"

AttributeValue = str | int | bool


@dataclass(slots=True)
class SpanRecord:
    """One finished (or running) span, with ids as integers."""

    name: str
    span_id: int
    parent_id: int
    start_ns: int
    end_ns: int = 0
    ok: bool = True
    attributes: dict[str, AttributeValue] = field(default_factory=dict)

    def set(self, key: str, value: AttributeValue) -> None:
        """An attribute, within the limits (past them it is dropped, text is cut)."""
        if len(self.attributes) >= MAX_ATTRIBUTES and key not in self.attributes:
            return
        if isinstance(value, str):
            value = value[:MAX_ATTRIBUTE_TEXT]
        self.attributes[key[:MAX_ATTRIBUTE_KEY]] = value

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "span_id": f"{self.span_id:016x}",
            "parent_id": f"{self.parent_id:016x}",
            "start_ns": self.start_ns,
            "end_ns": self.end_ns or self.start_ns,
            "status": "ok" if self.ok else "error",
            "attributes": dict(self.attributes),
        }


class TaskTrace:
    """The spans of one task in the collector, under one root (``versus.collector.task``) whose
    parent is the gateway's hand-out span."""

    def __init__(self, handed_out: TraceParent, clock_ns: Callable[[], int] = time.time_ns):
        self._clock = clock_ns
        self.trace_id = handed_out.trace_id
        self.root = SpanRecord("versus.collector.task", new_span_id(), handed_out.span_id, clock_ns())
        self._spans: list[SpanRecord] = [self.root]

    @property
    def context(self) -> TraceParent:
        """The root span's context (what the report's ``traceparent`` names)."""
        return TraceParent(self.trace_id, self.root.span_id, True)

    @contextmanager
    def span(self, name: str, **attributes: AttributeValue) -> Iterator[SpanRecord]:
        """A child of the root around a block; an exception leaving it marks it as an error."""
        record = SpanRecord(name, new_span_id(), self.root.span_id, self._clock())
        for key, value in attributes.items():
            record.set(key, value)
        if len(self._spans) < MAX_SPANS:
            self._spans.append(record)
        try:
            yield record
        except BaseException:
            record.ok = False
            raise
        finally:
            record.end_ns = self._clock()

    def finish(self, outcome: str) -> dict[str, Any]:
        """End the root with the task's outcome and give the report's ``trace`` member."""
        self.root.set("versus.outcome", outcome)
        self.root.ok = outcome in ("success", "running")
        self.root.end_ns = self.root.end_ns or self._clock()
        return {"traceparent": self.context.header(), "spans": [s.wire() for s in self._spans]}


def from_wire(spans: list[Mapping[str, Any]]) -> list[SpanRecord]:
    """Spans in the wire form (already checked against the limits above) as records."""
    return [
        SpanRecord(
            name=str(s["name"]),
            span_id=int(s["span_id"], 16),
            parent_id=int(s["parent_id"], 16),
            start_ns=int(s["start_ns"]),
            end_ns=int(s["end_ns"]),
            ok=s.get("status", "ok") == "ok",
            attributes=dict(s.get("attributes") or {}),
        )
        for s in spans
    ]
