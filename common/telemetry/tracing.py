"""Tracing for the services: off unless the standard ``OTEL_*`` settings turn it on, free when off.

The services open spans through this module only. While tracing is off (the default) nothing of
OpenTelemetry is imported, no exporter exists, and :func:`span` hands back one shared do-nothing
handle: a task pays an attribute check per span site, nothing more. When the settings turn it on,
:func:`common.telemetry.otel.configure` loads the SDK with the OTLP/gRPC exporter and installs it here.

Turned on by (docs/operations.md, "Tracing"): ``OTEL_TRACES_EXPORTER`` set to ``otlp`` or
``console``, or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) with no exporter named. ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keep it off. Everything else (endpoint, headers, TLS, sampler,
batching, resource attributes) the SDK reads from its own standard variables.

Spans are *rooted* only where work enters the control plane (an RPC, a submitted task): a span
site deeper in (a placement by the sweeper, say) opens a span only under a current span or the
context the task carries, so background work never starts traces of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from common.errors import ConfigError
from common.telemetry.span_record import SpanRecord
from common.telemetry.trace_context import TraceParent

ATTRIBUTE = str | int | float | bool

EXPORTERS = frozenset({"otlp", "console"})


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """What the environment asks for: the exporter (``otlp`` over gRPC, or ``console``)."""

    exporter: str


def settings_from(environ: Mapping[str, str]) -> TracingSettings | None:
    """Whether the ``OTEL_*`` settings turn tracing on, and how; None when off.

    Raises ConfigError for an exporter or OTLP protocol this build does not have (rather than
    starting without the traces the operator asked for)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    named = [e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if not named:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        named = ["otlp"] if endpoint else []
    if not named or named == ["none"]:
        return None
    if len(named) > 1 or named[0] not in EXPORTERS:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={','.join(named)}: this build exports traces with one of "
            f"{', '.join(sorted(EXPORTERS))} (or none)",
            code="tracing_exporter_unsupported",
        )
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )
    if named[0] == "otlp" and protocol.strip().lower() != "grpc":
        raise ConfigError(
            f"OTLP protocol {protocol!r}: this build exports OTLP over gRPC only (grpc)",
            code="tracing_protocol_unsupported",
        )
    return TracingSettings(exporter=named[0])


class SpanHandle(Protocol):
    """What a span site may do with its span."""

    def set(self, key: str, value: ATTRIBUTE) -> None: ...
    def fail(self, code: str) -> None: ...
    def traceparent(self) -> str: ...


class _NoSpan:
    """The handle while tracing is off, or where no span is opened: it does nothing."""

    __slots__ = ()

    def set(self, key: str, value: ATTRIBUTE) -> None:
        return None

    def fail(self, code: str) -> None:
        return None

    def traceparent(self) -> str:
        return ""


NO_SPAN: SpanHandle = _NoSpan()
# What every span site gets while tracing is off: one reusable do-nothing context manager.
OFF: contextlib.AbstractContextManager[SpanHandle] = contextlib.nullcontext(NO_SPAN)


class Backend(Protocol):
    """The SDK side (common/telemetry/otel.py), present only while tracing is on."""

    def span(
        self, name: str, parent: TraceParent | None, root: bool, kind: str, current: bool,
        attributes: Mapping[str, ATTRIBUTE],
    ) -> contextlib.AbstractContextManager[SpanHandle]: ...  # fmt: skip
    def current(self) -> TraceParent | None: ...
    def export_foreign(self, resource: Mapping[str, str], trace_id: int, spans: list[SpanRecord]) -> None: ...
    def shutdown(self, timeout_s: float) -> None: ...


_backend: Backend | None = None


def install(backend: Backend | None) -> None:
    """Turn tracing on with ``backend`` (common/telemetry/otel.py ``configure`` builds it: the SDK is
    imported there and only there, so the collector, which never traces itself, never loads it);
    None turns it off again (tests)."""
    global _backend
    _backend = backend


def enabled() -> bool:
    return _backend is not None


def span(
    name: str,
    *,
    parent: str | TraceParent | None = None,
    root: bool = False,
    kind: str = "internal",
    current: bool = True,
    attributes: Mapping[str, ATTRIBUTE] | None = None,
) -> contextlib.AbstractContextManager[SpanHandle]:
    """A span around a block.

    ``parent``: the context it continues (a ``traceparent`` value or parsed), used when no current
    span of the same trace is open. Without a parent or a current span, a span opens only with
    ``root`` (work entering the control plane). ``current=False`` does not make it the current
    span (around an async generator's yields, say). ``kind``: internal, server, client."""
    if _backend is None:
        return OFF
    from common.telemetry.trace_context import parse

    context = parse(parent) if isinstance(parent, str) else parent
    return _backend.span(name, context, root, kind, current, attributes or {})


def current_traceparent() -> str:
    """The current span's ``traceparent``; empty when off or outside any span."""
    if _backend is None:
        return ""
    context = _backend.current()
    return context.header() if context is not None else ""


def inject(metadata: MutableMapping[str, str] | list[tuple[str, str]]) -> None:
    """Add the current span's ``traceparent`` to outgoing gRPC metadata (nothing when off)."""
    value = current_traceparent()
    if not value:
        return
    if isinstance(metadata, list):
        metadata.append(("traceparent", value))
    else:
        metadata["traceparent"] = value


def export_foreign(resource: Mapping[str, str], trace_id: int, spans: list[SpanRecord]) -> None:
    """Export spans another process recorded (a collector's, carried home in its report) under
    that process's resource; nothing when off."""
    if _backend is not None and spans:
        _backend.export_foreign(resource, trace_id, spans)


def shutdown(timeout_s: float = 5.0) -> None:
    """Flush what is batched and stop exporting (at a process's orderly stop)."""
    global _backend
    if _backend is not None:
        _backend.shutdown(timeout_s)
        _backend = None


def log_ids(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the current span's trace and span ids on every log line."""
    if _backend is not None and "trace_id" not in event_dict:
        context = _backend.current()
        if context is not None:
            event_dict["trace_id"] = context.trace_hex
            event_dict["span_id"] = context.span_hex
    return event_dict
