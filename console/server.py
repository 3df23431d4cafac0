"""`versus-cp console`: the operator console over HTTPS (the gateway's TLS material by default).

It needs Redis (sessions) and the router's gRPC address; it never opens PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import uvicorn

from common.config.settings import Settings
from common.config.state_dir import ensure_writable
from common.errors import ConfigError, StartupError
from common.redis.client import check_reachable, create_async
from common.runtime import early_signals
from common.runtime.draining_server import DrainingServer
from common.runtime.service import PARENT_PID_ENV, setup_logging
from common.telemetry.logs import get_logger
from common.trust.ca_store import CaStore
from common.trust.tls import resolve_tls
from console.app import create_app
from console.backend import Backend
from console.sessions import SessionStore

log = get_logger("versus.console")


def origins(settings: Settings) -> tuple[str, ...]:
    """The origins browsers may send for the console's pages: its public URL when set, else its
    TLS server name and its own listen address, each with the console's port."""
    if settings.console_public_url:
        return (settings.console_public_url.rstrip("/"),)
    return (f"https://{settings.gateway_server_name}:{settings.console_port}", settings.console_url)


async def _watch_parent(server: uvicorn.Server) -> None:
    raw = os.environ.get(PARENT_PID_ENV)
    while not server.should_exit:
        if (raw and os.getppid() != int(raw)) or early_signals.requested() is not None:
            server.should_exit = True
            return
        await asyncio.sleep(1.0)  # as the other services watch theirs


async def serve(settings: Settings) -> None:
    setup_logging(settings, "console")
    if not settings.redis_url:
        raise ConfigError("REDIS_URL must be set for the console (its sessions live there)")
    check_reachable(settings.redis_url)
    if not settings.gateway_tls:
        raise ConfigError("the console serves HTTPS only (its session cookie is Secure)")
    tls = resolve_tls(settings, CaStore(ensure_writable(settings.state_dir)))
    if tls is None:
        raise StartupError("no TLS material for the console")
    redis = create_async(settings.redis_url)
    backend = Backend(settings.router_address, settings.enrollment_address)
    server: uvicorn.Server | None = None
    app = create_app(
        backend, SessionStore(redis), origins(settings), stopping=lambda: server is None or server.should_exit
    )
    config = uvicorn.Config(
        app, host=settings.console_host, port=settings.console_port, ssl_certfile=str(tls.cert_file),
        ssl_keyfile=str(tls.key_file), lifespan="off", log_config=None, access_log=False,
        server_header=False, timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )  # fmt: skip
    server = DrainingServer(config, 0.0)
    early_signals.install()
    server.should_exit = early_signals.requested() is not None
    watchdog = asyncio.create_task(_watch_parent(server))
    log.info("serving", service="console", url=origins(settings)[0])
    try:
        await server.serve()
    finally:
        watchdog.cancel()
        with contextlib.suppress(Exception):
            await backend.close()
            await redis.aclose()
