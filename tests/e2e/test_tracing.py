"""Tracing across the processes, against a real OTLP receiver (the OTLP/gRPC trace service).

A platform submits a reconcilable mutation under its own trace; the device applies it but will not
confirm it, and the check cannot tell, so the router's ladder sends reconcile-reads until its
bound and the task waits for an operator. Everything that happened to the task is one trace, with
spans from the router, the gateway and the collector, each hung under the span that caused it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from common.telemetry.trace_context import TraceParent, new_span_id, new_trace_id
from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane
from tests.support.otlp import ReceivedSpan, otlp_receiver

RECONCILE_BOUND = 3


def _complete(caller: TraceParent) -> Callable[[list[ReceivedSpan]], bool]:
    """Every step of the task seen, and every span's parent with it: a parent ends after its
    children, so it may come in a later export than they do."""

    def seen(spans: list[ReceivedSpan]) -> bool:
        ours = [s for s in spans if s.trace_id == caller.trace_hex]
        names = Counter(s.name for s in ours)
        ids = {s.span_id for s in ours} | {caller.span_hex}
        return (
            names["versus.reconcile.answer"] >= RECONCILE_BOUND
            and names["versus.collector.task"] >= 1 + RECONCILE_BOUND
            and names["versus.gateway.report"] >= 1 + RECONCILE_BOUND
            and all(s.parent_id in ids for s in ours)
        )

    return seen


@pytest.mark.timeout(120)
def test_one_task_through_reconcile_reads_is_one_trace_across_the_processes(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    with otlp_receiver() as receiver:
        cp = start_control_plane(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100",
            VERSUS_LOG_FORMAT="json",
        )  # fmt: skip
        collector = Collector(cp, tmp_path / "traced", tmp_path / "traced.log")
        collector_id = collector.enroll()
        platform = Platform(cp)
        caller = TraceParent(new_trace_id(), new_span_id(), True)
        try:
            collector.start()
            task_id = platform.submit(
                collector.site_id, "append", "mutate_reconcilable", "dev-traced",
                {"unclear": True, "check_error": True}, "traced-1",
                metadata=[("traceparent", caller.header())],
            )  # fmt: skip
            platform.wait_state(task_id, {"indeterminate"}, timeout=60)
            spans = receiver.wait_for(_complete(caller))
        finally:
            collector.stop()
            platform.close()
        log = cp.log_since(0)

    ours = [s for s in spans if s.trace_id == caller.trace_hex]
    # Everything about this task is in the caller's trace, and nothing of it anywhere else.
    assert {s.trace_id for s in spans if s.attributes.get("versus.task_id") == task_id} == {caller.trace_hex}
    assert {s.service for s in ours} == {"versus-router", "versus-gateway", "versus-collector"}
    by_id = {s.span_id: s for s in ours}
    assert len(by_id) == len(ours), "span ids are unique"
    # One tree: the router's server span hangs under the caller's span, every other under one of ours.
    (entry,) = [s for s in ours if s.parent_id == caller.span_hex]
    assert (entry.service, entry.name) == ("versus-router", "versus.router.v1.TaskRouterService/SubmitTask")
    orphans = [(s.service, s.name) for s in ours if s is not entry and s.parent_id not in by_id]
    assert orphans == []

    def parent(s: ReceivedSpan) -> ReceivedSpan:
        return by_id[s.parent_id]

    names = Counter(s.name for s in ours)
    assert names["versus.task.submit"] == 1 and parent(_one(ours, "versus.task.submit")) is entry
    leases = [s for s in ours if s.name == "versus.dispatch.lease"]
    kinds = Counter(s.attributes["versus.dispatch_kind"] for s in leases)
    assert kinds == {"execute": 1, "reconcile": RECONCILE_BOUND}, kinds
    for handout in (s for s in ours if s.name == "versus.gateway.handout"):
        assert parent(handout).name == "versus.dispatch.lease"
        assert handout.attributes["versus.collector_id"] == collector_id
    for task in (s for s in ours if s.name == "versus.collector.task"):
        # The collector's spans: under the gateway's hand-out, exported under its own resource.
        assert parent(task).name == "versus.gateway.handout"
        assert (task.service, task.instance) == ("versus-collector", collector_id)
    children = Counter(parent(s).name for s in ours if s.name in ("versus.collector.verify",
                                                                   "versus.collector.execute"))  # fmt: skip
    assert children == {"versus.collector.task": 2 * (1 + RECONCILE_BOUND)}
    # The execution's local reconcile-read, then the router's ladder.
    assert parent(_one(ours, "versus.collector.reconcile")).name == "versus.collector.task"
    for report in (s for s in ours if s.name == "versus.gateway.report"):
        assert parent(report).name == "versus.collector.task"
    for received in (s for s in ours if s.name == "versus.router.report"):
        assert (received.service, parent(received).name) == ("versus-router", "versus.gateway.report")
    outcomes = [s for s in ours if s.name == "versus.task.outcome"]
    assert {parent(s).name for s in outcomes} == {"versus.router.report"}
    step = _one(ours, "versus.ladder.step")
    assert parent(step).name == "versus.task.outcome"
    assert step.attributes["versus.ladder.step"] == "reconcile"
    reconciles = [s for s in ours if s.name == "versus.task.reconcile"]
    assert len(reconciles) == RECONCILE_BOUND
    for lease in (s for s in leases if s.attributes["versus.dispatch_kind"] == "reconcile"):
        assert parent(lease).name == "versus.task.reconcile"
    answers = [s for s in ours if s.name == "versus.reconcile.answer"]
    assert {parent(s).name for s in answers} == {"versus.task.outcome"}
    assert answers[-1].attributes["versus.state"] == "indeterminate" or any(
        a.attributes["versus.state"] == "indeterminate" for a in answers
    )
    # Enrollment: the gateway's span, and the enrollment service's under it (a trace of its own).
    enrolls = [s for s in spans if s.name == "versus.gateway.enroll"]
    assert len(enrolls) == 1 and enrolls[0].parent_id == ""
    (enrolled,) = [s for s in spans if s.parent_id == enrolls[0].span_id]
    assert (enrolled.service, enrolled.name) == (
        "versus-enrollment",
        "versus.enrollment.v1.EnrollmentService/Enroll",
    )
    # Log lines written inside a span name it.
    indeterminate = [line for line in log.splitlines() if '"task indeterminate"' in line]
    assert indeterminate and all(caller.trace_hex in line for line in indeterminate), indeterminate
    assert re.search(rf'"trace_id": ?"{caller.trace_hex}"', log)


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (found,) = [s for s in spans if s.name == name]
    return found
