"""Tracing on, in this process, with the real SDK exporting to memory (tests of span sites)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.telemetry import otel, tracing


@contextmanager
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    """Every span ended inside the block, kept in memory; tracing off again after it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracing.install(otel.OtelBackend(provider, processor))  # type: ignore[arg-type]
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()
