"""Trace context at the collector edge: the hand-out span a claim answer carries to the collector,
and the spans a collector's report brings home (docs/operations.md, "Tracing").

Both are telemetry only. The context rides beside the signed envelope, never in it; a report's
``trace`` member that does not fit the limits is dropped (and counted), never the report.
"""

from __future__ import annotations

from common.telemetry import span_record, trace_context, tracing
from gateway.collector_bodies import TraceBody

COLLECTOR_SERVICE = "versus-collector"


def handout(traceparent: str, collector_id: str, dispatch_id: str, transport: str) -> str:
    """Record the hand-out of one dispatch under its lease span; the context the collector continues
    ("" when the dispatch is untraced or tracing is off here)."""
    if not traceparent or not tracing.enabled():
        return ""
    attributes = {"versus.collector_id": collector_id, "versus.dispatch_id": dispatch_id,
                  "versus.transport": transport}  # fmt: skip
    with tracing.span(
        "versus.gateway.handout", parent=traceparent, kind="server", attributes=attributes
    ) as span:
        return span.traceparent()


def report_trace(trace: TraceBody | None) -> TraceBody | None:
    """A report's ``trace`` member when it is to be exported: tracing on here, and sampled."""
    if trace is None or not tracing.enabled():
        return None
    parsed = trace_context.parse(trace.traceparent)
    return trace if parsed is not None and parsed.sampled else None


def export_collector_spans(trace: TraceBody, collector_id: str) -> None:
    """The collector's spans, exported under its own resource (it exports nothing itself)."""
    parsed = trace_context.parse(trace.traceparent)
    assert parsed is not None
    records = span_record.from_wire([s.model_dump() for s in trace.spans])
    resource = {"service.name": COLLECTOR_SERVICE, "service.instance.id": collector_id}
    tracing.export_foreign(resource, parsed.trace_id, records)
