"""Tracing, fed values: W3C trace context, the settings that turn tracing on, the collector's span
records, and the span rules on the SDK (an in-memory exporter stands in for OTLP, which the
e2e test checks for real: tests/e2e/test_tracing.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.errors import ConfigError
from common.telemetry import span_record, trace_context, tracing
from common.telemetry.span_record import MAX_ATTRIBUTE_TEXT, MAX_SPANS, TaskTrace
from common.telemetry.trace_context import TraceParent
from tests.support.spans import recorded_spans

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_well_formed_traceparent_is_read_and_written_back() -> None:
    parsed = trace_context.parse(GOOD)
    assert parsed == TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    assert parsed.header() == GOOD
    unsampled = trace_context.parse(GOOD[:-2] + "00")
    assert unsampled is not None and not unsampled.sampled
    # A later version is read by its first four fields, whatever follows.
    later = trace_context.parse("01" + GOOD[2:] + "-whatever")
    assert later is not None and later.trace_id == parsed.trace_id


@pytest.mark.parametrize(
    "value",
    [
        None, "", 42, GOOD.upper(), GOOD + "-extra",  # version 00 has exactly four fields
        "ff" + GOOD[2:],  # version ff is forbidden
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
        "0" * 600,
    ],
)  # fmt: skip
def test_anything_else_is_no_context_rather_than_an_error(value: object) -> None:
    assert trace_context.parse(value) is None


@pytest.mark.parametrize(
    ("environ", "exporter"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "x"}, None),  # resource settings alone turn nothing on
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://otel:4317"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "otlp"),
    ],
)
def test_tracing_is_off_unless_the_standard_settings_turn_it_on(
    environ: dict[str, str], exporter: str | None
) -> None:
    settings = tracing.settings_from(environ)
    assert (settings.exporter if settings else None) == exporter


@pytest.mark.parametrize(
    ("environ", "code"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "tracing_exporter_unsupported"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "tracing_exporter_unsupported"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
         "tracing_protocol_unsupported"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "tracing_protocol_unsupported"),
    ],
)  # fmt: skip
def test_settings_this_build_cannot_honour_refuse_to_start(environ: dict[str, str], code: str) -> None:
    with pytest.raises(ConfigError) as refused:
        tracing.settings_from(environ)
    assert refused.value.code == code


def test_with_tracing_off_a_service_loads_nothing_of_opentelemetry() -> None:
    """The process a service runs in, started as it is, with no OTEL_* setting: no tracer provider,
    no exporter. (redis-py imports OpenTelemetry's *metrics* SDK whenever it is installed, for its
    own optional instrumentation, which stays off: that is not ours to count.)"""
    script = (
        "import json, sys\n"
        "from common.grpc import server, client\n"
        "from common.runtime.service import start_tracing\n"
        "from common.telemetry import tracing\n"
        "start_tracing('router')\n"
        "with tracing.span('x', root=True) as s:\n"
        "    s.set('k', 1)\n"
        "ours = ('opentelemetry.sdk.trace', 'opentelemetry.exporter', 'common.telemetry.otel')\n"
        "loaded = [m for m in sys.modules if m.startswith(ours)]\n"
        "on, off = tracing.enabled(), s is tracing.NO_SPAN\n"
        "print(json.dumps([on, off, tracing.current_traceparent(), loaded]))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "gen"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == [False, True, "", []]


def test_the_collectors_spans_hang_under_the_handout_and_carry_its_outcome() -> None:
    ticks = iter(range(1_000, 10_000, 10))
    handed = TraceParent(trace_context.new_trace_id(), trace_context.new_span_id(), True)
    trace = TaskTrace(handed, clock_ns=lambda: next(ticks))
    with trace.span("versus.collector.verify"):
        pass

    def run_failing() -> None:
        with trace.span("versus.collector.execute", provider="stub") as failing:
            failing.set("versus.note", "x" * 1000)
            raise RuntimeError("driver failed")

    with pytest.raises(RuntimeError):
        run_failing()
    wire = trace.finish("failed")
    assert wire["traceparent"] == TraceParent(handed.trace_id, trace.root.span_id, True).header()
    spans = {s["name"]: s for s in wire["spans"]}
    assert spans["versus.collector.task"]["parent_id"] == f"{handed.span_id:016x}"
    root_id = spans["versus.collector.task"]["span_id"]
    assert spans["versus.collector.verify"]["parent_id"] == root_id
    assert spans["versus.collector.execute"]["parent_id"] == root_id
    assert (spans["versus.collector.verify"]["status"], spans["versus.collector.execute"]["status"]) == (
        "ok",
        "error",
    )
    assert spans["versus.collector.task"]["status"] == "error"
    assert spans["versus.collector.task"]["attributes"]["versus.outcome"] == "failed"
    assert len(spans["versus.collector.execute"]["attributes"]["versus.note"]) == MAX_ATTRIBUTE_TEXT
    assert all(s["start_ns"] <= s["end_ns"] for s in wire["spans"])
    # The wire form reads back as the same records (what the gateway exports).
    back = span_record.from_wire(wire["spans"])
    assert [(r.name, r.span_id, r.parent_id, r.ok) for r in back] == [
        (s["name"], int(s["span_id"], 16), int(s["parent_id"], 16), s["status"] == "ok")
        for s in wire["spans"]
    ]


def test_a_task_records_at_most_its_limit_of_spans() -> None:
    trace = TaskTrace(TraceParent(1, 2, True))
    for _ in range(MAX_SPANS + 10):
        with trace.span("versus.collector.execute"):
            pass
    assert len(trace.finish("success")["spans"]) == MAX_SPANS


@pytest.fixture
def sdk() -> Iterator[InMemorySpanExporter]:
    """The real backend on the SDK, exporting to memory, for the length of one test."""
    with recorded_spans() as exporter:
        yield exporter


def test_spans_root_only_where_work_enters_and_continue_what_they_are_given(
    sdk: InMemorySpanExporter,
) -> None:
    # Deep inside (no current span, no context): nothing is recorded.
    with tracing.span("versus.task.place") as none:
        assert none.traceparent() == ""
    platform = TraceParent(trace_context.new_trace_id(), trace_context.new_span_id(), True)
    with tracing.span("submit", parent=platform.header(), root=True, kind="server") as submit:
        stored = submit.traceparent()
        with tracing.span("versus.task.place", parent=stored) as place:
            inner = tracing.current_traceparent()
            assert inner == place.traceparent()
    # Later, elsewhere: the stored context is continued.
    with tracing.span("versus.ladder.step", parent=stored) as step:
        step.fail("stub_unclear")
    spans = {s.name: s for s in sdk.get_finished_spans()}
    assert set(spans) == {"submit", "versus.task.place", "versus.ladder.step"}
    assert {s.context.trace_id for s in spans.values()} == {platform.trace_id}
    assert spans["submit"].parent is not None and spans["submit"].parent.span_id == platform.span_id
    assert spans["versus.task.place"].parent.span_id == spans["submit"].context.span_id  # type: ignore[union-attr]
    assert spans["versus.ladder.step"].parent.span_id == spans["submit"].context.span_id  # type: ignore[union-attr]
    assert spans["versus.ladder.step"].attributes["versus.error_code"] == "stub_unclear"  # type: ignore[index]
    # An unsampled caller's trace is honoured (the SDK's default sampler is parent-based).
    with tracing.span("submit", parent=TraceParent(5, 6, False), root=True) as unsampled:
        assert unsampled.traceparent().endswith("-00")
    assert len(sdk.get_finished_spans()) == 3


def test_a_collectors_spans_are_exported_under_its_own_resource(sdk: InMemorySpanExporter) -> None:
    trace = TaskTrace(TraceParent(77, 88, True))
    with trace.span("versus.collector.execute", detail="sent Bearer abcdefghijklmnop", token="hunter2"):
        pass
    wire = trace.finish("success")
    tracing.export_foreign(
        {"service.name": "versus-collector", "service.instance.id": "col-1"}, 77,
        span_record.from_wire(wire["spans"]),
    )  # fmt: skip
    spans = sdk.get_finished_spans()
    assert {s.resource.attributes["service.name"] for s in spans} == {"versus-collector"}
    assert {s.context.trace_id for s in spans} == {77}
    root = next(s for s in spans if s.name == "versus.collector.task")
    assert root.parent is not None and root.parent.span_id == 88
    execute = next(s for s in spans if s.name == "versus.collector.execute")
    # Redacted as in the logs, by shape and by name.
    assert dict(execute.attributes or {}) == {"detail": "sent Bearer [REDACTED]", "token": "[REDACTED]"}


def test_a_report_whose_trace_does_not_fit_is_recorded_without_it() -> None:
    from gateway.collector_bodies import ReportBody
    from gateway.metrics import TRACES_DROPPED

    report = {"task_id": "dsp-1", "outcome": "success", "signature": "x"}
    span = {"name": "versus.collector.task", "span_id": "1" * 16, "parent_id": "2" * 16, "start_ns": 1,
            "end_ns": 2}  # fmt: skip
    good = ReportBody.model_validate({**report, "trace": {"traceparent": GOOD, "spans": [span]}})
    assert good.trace is not None and good.trace.spans[0].name == "versus.collector.task"
    before = TRACES_DROPPED._value.get()
    for bad in (
        {"traceparent": "nonsense"},
        {"traceparent": GOOD, "spans": [{**span, "name": "not.ours"}]},
        {"traceparent": GOOD, "spans": [span] * (MAX_SPANS + 1)},
        {"traceparent": GOOD, "spans": [{**span, "attributes": {"k": "x" * (MAX_ATTRIBUTE_TEXT + 1)}}]},
        "not an object",
    ):
        body = ReportBody.model_validate({**report, "trace": bad})
        assert (body.task_id, body.outcome, body.trace) == ("dsp-1", "success", None)
    assert TRACES_DROPPED._value.get() == before + 5
