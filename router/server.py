"""The router process: TaskRouterService (platform-facing), CollectorBridgeService
(gateway-facing) and FleetService (operators) on one gRPC port, plus the sweeper."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Callable, Mapping
from pathlib import Path

from versus.access.v1 import access_pb2, access_pb2_grpc
from versus.credential.v1 import credential_pb2, credential_pb2_grpc
from versus.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from versus.router.v1 import (
    collector_bridge_pb2,
    collector_bridge_pb2_grpc,
    task_router_pb2,
    task_router_pb2_grpc,
    tunnel_pb2,
    tunnel_pb2_grpc,
)

from common.access.api_tokens import TokenAuthenticator
from common.config.settings import KeyMaterialMode, Settings
from common.config.state_dir import ensure_writable
from common.db import engine as db_engine
from common.grpc.server import ServiceRegistration
from common.material import shared as material
from common.redis.client import create_async as create_redis
from common.runtime.service import check_backends, require_backends, serve_grpc_service
from common.telemetry import capacity
from common.telemetry.logs import get_logger
from common.trust.keys import KeyPurpose, KeySet
from common.trust.keystore import KeyStore, ReloadingKeySet
from common.trust.trust_bundle import BundleSource
from common.updates.repo_sync import SharedDirectory
from router.access.grpc_api import AccessServicer
from router.audit_export import settings as audit_export_settings
from router.audit_export.exporter import Exporter
from router.audit_export.settings import sinks as audit_sinks
from router.credentials.grpc_api import CredentialServicer
from router.credentials.store import CredentialStore
from router.credentials.vault import DEFAULT_FILE as DEFAULT_MASTER_FILE
from router.credentials.vault import MasterKeys
from router.dispatch.grpc_api import CollectorBridgeServicer, TaskRouterServicer
from router.dispatch.service import Router
from router.fleet import gauges
from router.fleet.enrollment_client import EnrollmentClient
from router.fleet.grpc_api import FleetServicer
from router.fleet.operations import Fleet
from router.releases.publishing import Releases
from router.releases.update_repo import UpdateRepository
from router.releases.update_share import SharedUpdateRepository
from router.releases.updates import Updates
from router.trust.delivery import TrustDelivery
from router.trust.key_chains import KeyChains
from router.tunnels.broker import TunnelHub
from router.tunnels.service import TunnelServicer

SWEEP_INTERVAL_S = 5.0

log = get_logger("versus.router")


def registrations(router: Router, clock: Callable[[], float] | None = None) -> list[ServiceRegistration]:
    """Services served by the router process; ``clock`` is the fleet's notion of now (default: the
    router's, PostgreSQL's time; tests move it)."""
    tunnels = []
    if router.tunnels is not None:
        tunnels.append(
            ServiceRegistration(
                tunnel_pb2.DESCRIPTOR.services_by_name["TunnelService"].full_name,
                TunnelServicer(router.tunnels, router.pick_tunnel_collector),
                tunnel_pb2_grpc.add_TunnelServiceServicer_to_server,
            )
        )
    bridge = CollectorBridgeServicer(router)
    exchange = bridge.exchange
    capacity.watch(
        capacity.GRPC_IN_FLIGHT, capacity.GRPC_LIMIT, ("router", "exchange"),
        lambda: float(exchange.in_flight()), lambda: float(exchange.in_flight_limit()),
    )  # fmt: skip
    return [
        *tunnels,
        ServiceRegistration(
            task_router_pb2.DESCRIPTOR.services_by_name["TaskRouterService"].full_name,
            TaskRouterServicer(router),
            task_router_pb2_grpc.add_TaskRouterServiceServicer_to_server,
        ),
        ServiceRegistration(
            collector_bridge_pb2.DESCRIPTOR.services_by_name["CollectorBridgeService"].full_name,
            bridge,
            collector_bridge_pb2_grpc.add_CollectorBridgeServiceServicer_to_server,
        ),
        ServiceRegistration(
            credential_pb2.DESCRIPTOR.services_by_name["CredentialService"].full_name,
            CredentialServicer(router),
            credential_pb2_grpc.add_CredentialServiceServicer_to_server,
        ),
        ServiceRegistration(
            fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
            FleetServicer(Fleet(router, clock or router.clock.now)),
            fleet_pb2_grpc.add_FleetServiceServicer_to_server,
        ),
        ServiceRegistration(
            access_pb2.DESCRIPTOR.services_by_name["AccessService"].full_name,
            AccessServicer(router.engine),
            access_pb2_grpc.add_AccessServiceServicer_to_server,
        ),
    ]


async def sample_gauges(router: Router, key_sets: Callable[[], Mapping[str, KeySet]] | None = None) -> None:
    """The fleet gauges (router/fleet/gauges.py): collectors, rollout, queues, leases, certificates, keys."""
    sets = key_sets() if key_sets is not None else {"dispatch": router.dispatch_keys()}
    await gauges.sample(router.engine, router.liveness, sets)


async def sample_forever(
    router: Router, key_sets: Callable[[], Mapping[str, KeySet]], stop: asyncio.Event,
    interval_s: float = gauges.SAMPLE_INTERVAL_S,
) -> None:  # fmt: skip
    """Sample the fleet gauges until ``stop``; a failed sample is logged and the last one stays."""
    while not stop.is_set():
        try:
            await sample_gauges(router, key_sets)
        except Exception:
            log.exception("sampling the fleet gauges failed; retrying next interval")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stop.wait()


# How often the router re-signs the update repository's timestamp and snapshot when they near
# expiry (router/releases/update_repo.py REFRESH_BEFORE), and follows a release key change.
UPDATES_REFRESH_S = 600.0


async def keep_updates_fresh(
    repo: UpdateRepository,
    keys: Callable[[], KeySet],
    stop: asyncio.Event,
    interval_s: float = UPDATES_REFRESH_S,
) -> None:
    """Until ``stop``: keep the update metadata from expiring (a client then stops trusting it)."""
    while not stop.is_set():
        try:
            await asyncio.to_thread(repo.ensure, keys(), dt.datetime.now(dt.UTC))
        except Exception:
            log.exception("refreshing the update repository failed; retrying next interval")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stop.wait()


async def sweep_forever(
    router: Router, interval_s: float = SWEEP_INTERVAL_S, stop: asyncio.Event | None = None
) -> None:
    """Sweep and re-place queued work on a timer until ``stop`` is set; errors are logged and the
    loop goes on.

    Shutdown sets ``stop`` rather than relying on cancellation alone: a cancellation that lands
    inside a database call can be absorbed by the driver's own cleanup, and a loop that
    depended on it would sweep on and hold the process open.
    """
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            counts = await router.sweep()
            await router.reevaluate()
            if any(counts.values()):
                log.info("sweep", **counts)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sweep failed; retrying next interval")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stop.wait()


async def stop_sweeper(sweeper: asyncio.Task[None], stop: asyncio.Event, grace_s: float) -> None:
    """Let the current sweep finish (within ``grace_s``), then make sure the task is gone."""
    stop.set()
    done, _ = await asyncio.wait({sweeper}, timeout=grace_s)
    if not done:
        log.warning("sweep still running at shutdown; cancelling it")
        sweeper.cancel()
        await asyncio.wait({sweeper}, timeout=1.0)


def update_repository(
    settings: Settings, state: Path, database_url: str
) -> tuple[UpdateRepository, SharedDirectory | None]:
    """The update repository: this host's directory, or with replicas on several hosts one shared
    through PostgreSQL (router/releases/update_share.py) and the copy that follows it."""
    if settings.key_material is not KeyMaterialMode.SHARED:
        return UpdateRepository(state / "updates"), None
    shared = SharedDirectory(
        state / "updates", db_engine.create_sync(database_url, pool_size=2, application_name="versus-updates")
    )
    return SharedUpdateRepository(shared), shared


async def serve(settings: Settings) -> None:
    database_url, redis_url = require_backends(settings, "router")
    audit_settings = audit_export_settings.load()  # a bad sink setting stops the start, in one line
    check_backends(database_url, redis_url)
    # Before any key is loaded: this host serves the deployment's material or none
    # (common/material/shared.py).
    follower = await material.start_service(settings, database_url, material.Role.CORE)
    state = ensure_writable(settings.state_dir)
    keys = ReloadingKeySet(KeyStore(state, KeyPurpose.DISPATCH))
    # The router's transactions are the hot path: no ping per checkout (see create_async), and
    # connections kept rather than opened per burst (docs/router.md, "PostgreSQL connections").
    engine = db_engine.create_async(
        database_url,
        pool_size=settings.router_db_pool,
        max_overflow=settings.router_db_overflow,
        pre_ping=False,
        application_name="versus-router",
    )
    router = Router(engine, create_redis(redis_url), keys.get)
    capacity.watch_db("router", engine)
    capacity.watch_redis("router", router.redis)
    router.output_task_limit = settings.output_task_limit_bytes
    router.output_tenant_quota = settings.output_tenant_quota_bytes
    router.output_retention_s = float(settings.output_retention_s)
    master_file = settings.credentials_master_keys_file or state / DEFAULT_MASTER_FILE
    router.credential_store = CredentialStore(engine, MasterKeys.load_or_create(master_file, create=False))
    router.key_chains = KeyChains(state)
    router.trust = TrustDelivery(BundleSource.from_settings(settings, state), keys.get, engine)
    router.tunnels = TunnelHub(router.redis, router.wake)
    router.enrollment = EnrollmentClient(settings.enrollment_address)
    router.start()
    stop_sweeping = asyncio.Event()
    sweeper = asyncio.create_task(sweep_forever(router, stop=stop_sweeping))
    # Root version 1 of the update repository is the release set collectors pin at enrollment.
    releases = ReloadingKeySet(KeyStore(state, KeyPurpose.RELEASE))
    repo, shared_updates = update_repository(settings, state, database_url)
    router.updates = Updates(engine, router.wake.publish, dt.timedelta(seconds=settings.update_soak_s))
    manifest_url = f"{settings.public_gateway_url}/api/collector/v1/updates/metadata/"
    router.releases = Releases(engine, repo, releases.get, router.updates, manifest_url)
    refresher = asyncio.create_task(keep_updates_fresh(repo, releases.get, stop_sweeping))
    reconciler = asyncio.create_task(router.updates.run(stop_sweeping))
    exporter = Exporter(engine, audit_sinks(audit_settings), audit_settings.source, audit_settings.batch)
    exporting = asyncio.create_task(exporter.run(stop_sweeping))
    sampler = asyncio.create_task(
        sample_forever(
            router,
            lambda: {"dispatch": keys.get(), "release": releases.get()},
            stop_sweeping,
            settings.router_fleet_sample_s,
        )
    )
    following = asyncio.create_task(follower.run(stop_sweeping)) if follower is not None else None
    updates_following = (
        asyncio.create_task(shared_updates.follow(stop_sweeping)) if shared_updates is not None else None
    )
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
        await stop_sweeper(sweeper, stop_sweeping, max(settings.shutdown_grace_s, 1.0))
        extra = [t for t in (following, updates_following) if t is not None]
        await asyncio.wait({refresher, reconciler, sampler, exporting, *extra}, timeout=5.0)
        if shared_updates is not None:
            shared_updates.engine.dispose()
        await router.aclose()
