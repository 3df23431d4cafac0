"""The router process: TaskRouterService (platform-facing), CollectorBridgeService
(gateway-facing) and FleetService (operators) on one gRPC port."""

from __future__ import annotations

from versus.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from versus.router.v1 import (
    collector_bridge_pb2,
    collector_bridge_pb2_grpc,
    task_router_pb2,
    task_router_pb2_grpc,
)

from common.grpc_server import ServiceRegistration, placeholder
from common.runtime import serve_grpc_service
from common.settings import Settings


def registrations() -> list[ServiceRegistration]:
    """Services served by the router. RPCs not built yet answer UNIMPLEMENTED."""
    return [
        ServiceRegistration(
            task_router_pb2.DESCRIPTOR.services_by_name["TaskRouterService"].full_name,
            placeholder(task_router_pb2_grpc.TaskRouterServiceServicer),
            task_router_pb2_grpc.add_TaskRouterServiceServicer_to_server,
        ),
        ServiceRegistration(
            collector_bridge_pb2.DESCRIPTOR.services_by_name["CollectorBridgeService"].full_name,
            placeholder(collector_bridge_pb2_grpc.CollectorBridgeServiceServicer),
            collector_bridge_pb2_grpc.add_CollectorBridgeServiceServicer_to_server,
        ),
        ServiceRegistration(
            fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
            placeholder(fleet_pb2_grpc.FleetServiceServicer),
            fleet_pb2_grpc.add_FleetServiceServicer_to_server,
        ),
    ]


async def serve(settings: Settings) -> None:
    await serve_grpc_service(
        settings,
        "router",
        host=settings.router_host,
        port=settings.router_port,
        metrics_port=settings.router_metrics_port,
        registrations=registrations(),
    )
