"""A real OTLP trace receiver for tests: the OTLP/gRPC ``TraceService`` from opentelemetry-proto on
a loopback port, keeping every span it is sent (as an OpenTelemetry Collector's receiver would)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as exported: ids in hex, the exporting resource's attributes, its own attributes."""

    service: str
    instance: str
    scope: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    ok: bool
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            instance=str(resource.get("service.instance.id", "")),
                            scope=ss.scope.name,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            ok=s.status.code != 2,  # STATUS_CODE_ERROR
                            attributes={a.key: _value(a.value) for a in s.attributes},
                        )
                    )
        with self.lock:
            self.requests += 1
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """The receiver's address (for ``OTEL_EXPORTER_OTLP_ENDPOINT``) and what it has received."""

    def __init__(self, receiver: _Receiver, port: int):
        self._receiver = receiver
        self.endpoint = f"http://127.0.0.1:{port}"

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._receiver.lock:
            return list(self._receiver.spans)

    @property
    def requests(self) -> int:
        with self._receiver.lock:
            return self._receiver.requests

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30
    ) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans
            if predicate(spans):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"the receiver never saw what was expected; it holds {len(self.spans)} spans")


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver on a free loopback port for the length of the block."""
    receiver = _Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield OtlpReceiver(receiver, port)
    finally:
        server.stop(grace=None)
