"""Process lifecycle shared by the service entry points (`versus-cp router|enrollment|gateway`).

A service process: validates that it has external PostgreSQL and Redis URLs,
proves both are reachable and the schema is migrated, serves until SIGTERM or
SIGINT (or until the `up` supervisor that started it disappears), then shuts
down gracefully within ``shutdown_grace_s``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Sequence

from common.config.settings import Settings
from common.errors import ConfigError, StartupError, Unavailable
from common.grpc.server import Authenticator, GrpcServer, ServiceRegistration
from common.redis.client import check_reachable as redis_reachable
from common.runtime import early_signals, sd_notify
from common.telemetry import tracing
from common.telemetry.logs import configure_logging, get_logger
from common.telemetry.metrics import SERVICE_UP, MetricsServer

# Set by `versus-cp up` on the services it starts; they exit if it goes away.
PARENT_PID_ENV = "VERSUS_PARENT_PID"

log = get_logger("versus.runtime")


def require_backends(settings: Settings, service: str) -> tuple[str, str]:
    """The PostgreSQL and Redis URLs a standalone service must be given."""
    missing = [
        name
        for name, value in (("DATABASE_URL", settings.database_url), ("REDIS_URL", settings.redis_url))
        if not value
    ]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} must be set for `versus-cp {service}`; "
            "use `versus-cp up` for the embedded servers"
        )
    assert settings.database_url and settings.redis_url
    # Tracing settings this build cannot honour are configuration errors too: refused before any
    # backend is asked for (common/telemetry/tracing.py).
    tracing.settings_from(os.environ)
    return settings.database_url, settings.redis_url


def check_backends(database_url: str, redis_url: str) -> None:
    """Fail fast with one clear line when a backend is unreachable or unmigrated."""
    # Here, not at the top: the console runs on this module too and never opens PostgreSQL, and
    # SQLAlchemy with psycopg is a quarter of a CPU-second of imports.
    from common.db import engine as db_engine
    from common.db import migrate

    try:
        db_engine.check_reachable(database_url)
        redis_reachable(redis_url)
    except Unavailable as exc:
        raise StartupError(exc.message) from None
    if not migrate.is_current(database_url):
        raise StartupError(
            f"database {db_engine.describe(database_url)} is not at the latest schema "
            f"({migrate.HEAD_REVISION}); run `versus-cp migrate`"
        )


def setup_logging(settings: Settings, service: str) -> None:
    configure_logging(fmt=settings.log_format.value, level=settings.log_level, service=service)


def start_tracing(service: str) -> None:
    """Tracing for a service process, when the ``OTEL_*`` settings turn it on (docs/operations.md,
    "Tracing"): its spans under ``service.name`` ``versus-<service>``, one instance per host and pid."""
    if tracing.settings_from(os.environ) is None:
        return  # off: nothing of OpenTelemetry is imported
    from common.telemetry import otel

    otel.configure(f"versus-{service}", f"{socket.gethostname()}:{os.getpid()}")


def shutdown_signals() -> asyncio.Future[str]:
    """A future resolved with the signal name on the first SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[str] = loop.create_future()

    def _signalled(name: str) -> None:
        if not stop.done():
            stop.set_result(name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _signalled, sig.name)
    # A signal that arrived while the process was still starting (common/runtime/early_signals.py).
    early = early_signals.requested()
    if early is not None:
        _signalled(early)
    return stop


async def wait_for_shutdown() -> str:
    """Block until SIGTERM/SIGINT arrives or the supervising parent exits; return why."""
    stop = shutdown_signals()
    watchdog = asyncio.create_task(_watch_parent(stop))
    try:
        return await stop
    finally:
        watchdog.cancel()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        # A second signal during the graceful stop is recorded, not fatal.
        early_signals.install()


async def _watch_parent(stop: asyncio.Future[str]) -> None:
    raw = os.environ.get(PARENT_PID_ENV)
    if not raw:
        return
    parent = int(raw)
    while not stop.done():
        if os.getppid() != parent:
            stop.set_result("supervisor exited")
            return
        await asyncio.sleep(1.0)


async def _watch_writable(database_url: str, metrics: MetricsServer, server: GrpcServer) -> None:
    """Readiness and gRPC health follow whether PostgreSQL takes writes (common/db/writable.py)."""
    from common.db.writable import WritableWatch

    async def changed(reason: str | None) -> None:
        metrics.blocked = reason
        await server.set_serving(reason is None)

    await WritableWatch(database_url, changed).run()


async def serve_grpc_service(
    settings: Settings,
    name: str,
    *,
    host: str,
    port: int,
    metrics_port: int,
    registrations: Sequence[ServiceRegistration],
    authenticator: Authenticator,
) -> None:
    """Run one gRPC service process from startup checks to graceful shutdown."""
    setup_logging(settings, name)
    start_tracing(name)
    database_url, redis_url = require_backends(settings, name)
    check_backends(database_url, redis_url)
    metrics = MetricsServer(host, metrics_port)
    server = GrpcServer(name, host, port, registrations, authenticator)
    metrics.start()
    try:
        await server.start()
        SERVICE_UP.labels(name).set(1)
        metrics.ready.set()
        sd_notify.ready()
        log.info("serving", service=name, grpc=server.address, metrics_port=metrics_port)
        watch = asyncio.create_task(_watch_writable(database_url, metrics, server), name="writable-watch")
        reason = await wait_for_shutdown()
        log.info("stopping", service=name, reason=reason)
        watch.cancel()
        metrics.ready.clear()
        sd_notify.stopping()
        SERVICE_UP.labels(name).set(0)
        await server.stop(settings.shutdown_grace_s)
    finally:
        metrics.stop()
        tracing.shutdown()
