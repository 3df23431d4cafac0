"""The OpenTelemetry SDK behind common/telemetry/tracing.py, imported only while tracing is on.

One tracer provider per process with the resource ``service.name`` = the service (the operator's
``OTEL_RESOURCE_ATTRIBUTES`` add to it), the sampler from ``OTEL_TRACES_SAMPLER`` (the SDK's
default, parent-based always-on, honours a caller's sampled flag), and one batch processor in
front of the exporter (``OTEL_BSP_*`` tune it). Spans other processes recorded (a collector's) go
through the same processor under their own resource.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from common.telemetry import tracing
from common.telemetry.logs import get_logger
from common.telemetry.redaction import redact
from common.telemetry.span_record import SpanRecord
from common.telemetry.trace_context import TraceParent
from common.telemetry.tracing import ATTRIBUTE, NO_SPAN, SpanHandle, TracingSettings

SCOPE = "versus"
_KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
_COLLECTOR_SCOPE = InstrumentationScope("versus.collector")

log = get_logger("versus.tracing")


class _Handle:
    __slots__ = ("_span",)

    def __init__(self, span: trace.Span):
        self._span = span

    def set(self, key: str, value: ATTRIBUTE) -> None:
        self._span.set_attribute(key, value)

    def fail(self, code: str) -> None:
        self._span.set_attribute("versus.error_code", code)
        self._span.set_status(Status(StatusCode.ERROR, code))

    def traceparent(self) -> str:
        context = self._span.get_span_context()
        if not context.is_valid:
            return ""
        return TraceParent(context.trace_id, context.span_id, context.trace_flags.sampled).header()


class OtelBackend:
    """Spans through the SDK; see common/telemetry/tracing.py for the rules the sites follow."""

    def __init__(self, provider: TracerProvider, processor: BatchSpanProcessor):
        self.provider = provider
        self.processor = processor
        self.tracer = provider.get_tracer(SCOPE)

    @contextlib.contextmanager
    def span(
        self, name: str, parent: TraceParent | None, root: bool, kind: str, current: bool,
        attributes: Mapping[str, ATTRIBUTE],
    ) -> Iterator[SpanHandle]:  # fmt: skip
        now = trace.get_current_span().get_span_context()
        context: Any = None  # the current context
        if parent is not None and not (now.is_valid and now.trace_id == parent.trace_id):
            remote = SpanContext(
                parent.trace_id, parent.span_id, is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED if parent.sampled else TraceFlags.DEFAULT),
            )  # fmt: skip
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        elif not now.is_valid and not root:
            yield NO_SPAN
            return
        span = self.tracer.start_span(name, context=context, kind=_KINDS[kind], attributes=dict(attributes))
        try:
            if current:
                with trace.use_span(
                    span, end_on_exit=False, record_exception=False, set_status_on_exception=False
                ):
                    yield _Handle(span)
            else:
                yield _Handle(span)
        except BaseException as exc:
            if span.is_recording():
                code = getattr(exc, "code", None)
                span.set_status(Status(StatusCode.ERROR, str(code or type(exc).__name__)))
            raise
        finally:
            span.end()

    def current(self) -> TraceParent | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return TraceParent(context.trace_id, context.span_id, context.trace_flags.sampled)

    def export_foreign(self, resource: Mapping[str, str], trace_id: int, spans: list[SpanRecord]) -> None:
        owner = Resource(dict(resource))
        flags = TraceFlags(TraceFlags.SAMPLED)
        for record in spans:
            attributes: dict[str, Any] = redact(dict(record.attributes))  # by name and by shape, as logs are
            self.processor.on_end(
                ReadableSpan(
                    name=record.name,
                    context=SpanContext(trace_id, record.span_id, is_remote=False, trace_flags=flags),
                    parent=SpanContext(trace_id, record.parent_id, is_remote=True, trace_flags=flags),
                    resource=owner,
                    attributes=attributes,
                    kind=SpanKind.INTERNAL,
                    status=Status(StatusCode.OK if record.ok else StatusCode.ERROR),
                    start_time=record.start_ns,
                    end_time=max(record.end_ns, record.start_ns),
                    instrumentation_scope=_COLLECTOR_SCOPE,
                )
            )

    def shutdown(self, timeout_s: float) -> None:
        self.processor.force_flush(int(timeout_s * 1000))
        self.provider.shutdown()


def _exporter(settings: TracingSettings) -> SpanExporter:
    if settings.exporter == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, TLS, compression and timeout: OTEL_EXPORTER_OTLP_*


def configure(service: str, instance: str = "", environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process if the ``OTEL_*`` settings ask for it; whether it is on.
    Safe to call more than once (the first call that turns it on wins)."""
    settings = tracing.settings_from(os.environ if environ is None else environ)
    if settings is not None and not tracing.enabled():
        tracing.install(start(service, instance, settings))
    return tracing.enabled()


def start(service: str, instance: str, settings: TracingSettings) -> OtelBackend:
    """A provider exporting this process's spans as ``settings`` ask."""
    attributes = {"service.name": service}
    if instance:
        attributes["service.instance.id"] = instance
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    processor = BatchSpanProcessor(_exporter(settings))
    provider.add_span_processor(processor)
    log.info("tracing on", exporter=settings.exporter, service=service)
    return OtelBackend(provider, processor)
