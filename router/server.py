"""The router process: TaskRouterService (platform-facing), CollectorBridgeService
(gateway-facing) and FleetService (operators) on one gRPC port, plus the sweeper."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from versus.access.v1 import access_pb2, access_pb2_grpc
from versus.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from versus.router.v1 import (
    collector_bridge_pb2,
    collector_bridge_pb2_grpc,
    task_router_pb2,
    task_router_pb2_grpc,
    tunnel_pb2,
    tunnel_pb2_grpc,
)

from common.api_tokens import TokenAuthenticator
from common.db import engine as db_engine
from common.grpc_server import ServiceRegistration
from common.keys import KeyPurpose
from common.keystore import KeyStore, ReloadingKeySet
from common.logs import get_logger
from common.redis_client import create_async as create_redis
from common.runtime import require_backends, serve_grpc_service
from common.settings import Settings
from common.state_dir import ensure_writable
from router import store
from router.access_api import AccessServicer
from router.fleet import Fleet
from router.fleet_api import FleetServicer
from router.grpc_api import CollectorBridgeServicer, TaskRouterServicer
from router.metrics import QUEUE_DEPTH
from router.service import Router
from router.tunnels import TunnelHub, TunnelServicer

SWEEP_INTERVAL_S = 5.0

log = get_logger("versus.router")


def registrations(router: Router, clock: Callable[[], float] = time.time) -> list[ServiceRegistration]:
    """Services served by the router process; ``clock`` is the fleet's notion of now (tests move it)."""
    tunnels = []
    if router.tunnels is not None:
        tunnels.append(
            ServiceRegistration(
                tunnel_pb2.DESCRIPTOR.services_by_name["TunnelService"].full_name,
                TunnelServicer(router.tunnels, router.pick_tunnel_collector),
                tunnel_pb2_grpc.add_TunnelServiceServicer_to_server,
            )
        )
    return [
        *tunnels,
        ServiceRegistration(
            task_router_pb2.DESCRIPTOR.services_by_name["TaskRouterService"].full_name,
            TaskRouterServicer(router),
            task_router_pb2_grpc.add_TaskRouterServiceServicer_to_server,
        ),
        ServiceRegistration(
            collector_bridge_pb2.DESCRIPTOR.services_by_name["CollectorBridgeService"].full_name,
            CollectorBridgeServicer(router),
            collector_bridge_pb2_grpc.add_CollectorBridgeServiceServicer_to_server,
        ),
        ServiceRegistration(
            fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
            FleetServicer(Fleet(router, clock)),
            fleet_pb2_grpc.add_FleetServiceServicer_to_server,
        ),
        ServiceRegistration(
            access_pb2.DESCRIPTOR.services_by_name["AccessService"].full_name,
            AccessServicer(router.engine),
            access_pb2_grpc.add_AccessServiceServicer_to_server,
        ),
    ]


async def sweep_forever(router: Router, interval_s: float = SWEEP_INTERVAL_S) -> None:
    """Sweep and re-place queued work on a timer; errors are logged and the loop goes on."""
    while True:
        try:
            counts = await router.sweep()
            await router.reevaluate()
            async with router.engine.connect() as conn:
                QUEUE_DEPTH.set(await store.queued_count(conn))
            if any(counts.values()):
                log.info("sweep", **counts)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sweep failed; retrying next interval")
        await asyncio.sleep(interval_s)


async def serve(settings: Settings) -> None:
    database_url, redis_url = require_backends(settings, "router")
    state = ensure_writable(settings.state_dir)
    keys = ReloadingKeySet(KeyStore(state, KeyPurpose.DISPATCH))
    # The router's transactions are the hot path: no ping per checkout (see create_async).
    engine = db_engine.create_async(database_url, pool_size=20, max_overflow=20, pre_ping=False)
    router = Router(engine, create_redis(redis_url), lambda: keys.get().current)
    router.tunnels = TunnelHub(router.redis, settings.router_address)
    router.wake.start()
    sweeper = asyncio.create_task(sweep_forever(router))
    try:
        await serve_grpc_service(
            settings,
            "router",
            host=settings.router_host,
            port=settings.router_port,
            metrics_port=settings.router_metrics_port,
            registrations=registrations(router),
            authenticator=TokenAuthenticator(engine),
        )
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        await router.aclose()
