"""The enrollment process: EnrollmentService on its own gRPC port."""

from __future__ import annotations

from versus.enrollment.v1 import enrollment_pb2, enrollment_pb2_grpc

from common.grpc_server import ServiceRegistration, placeholder
from common.runtime import serve_grpc_service
from common.settings import Settings


def registrations() -> list[ServiceRegistration]:
    """Services served by the enrollment process. RPCs not built yet answer UNIMPLEMENTED."""
    return [
        ServiceRegistration(
            enrollment_pb2.DESCRIPTOR.services_by_name["EnrollmentService"].full_name,
            placeholder(enrollment_pb2_grpc.EnrollmentServiceServicer),
            enrollment_pb2_grpc.add_EnrollmentServiceServicer_to_server,
        ),
    ]


async def serve(settings: Settings) -> None:
    await serve_grpc_service(
        settings,
        "enrollment",
        host=settings.enrollment_host,
        port=settings.enrollment_port,
        metrics_port=settings.enrollment_metrics_port,
        registrations=registrations(),
    )
