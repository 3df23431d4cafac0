"""The gateway process: the ASGI app on uvicorn (websockets backend), HTTPS by default."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
from typing import Any

import uvicorn

from common.config.settings import KeyMaterialMode, Settings
from common.config.state_dir import ensure_writable
from common.db import engine as db_engine
from common.errors import StartupError
from common.grpc import token_files
from common.material import shared as material
from common.runtime import early_signals
from common.runtime.service import (
    PARENT_PID_ENV,
    check_backends,
    require_backends,
    setup_logging,
    start_tracing,
)
from common.telemetry import tracing
from common.telemetry.logs import get_logger
from common.telemetry.metrics import SERVICE_UP
from common.trust.ca_store import CaStore
from common.trust.tls import resolve_tls
from common.trust.trust_bundle import BundleSource
from common.updates.repo_sync import SharedDirectory
from gateway import edge
from gateway.admission import AdmissionLimits
from gateway.app import GatewayConfig, create_app
from gateway.control_socket import CollectorWebSocketProtocol
from gateway.edge import MAX_HEADER_BYTES, TLS_HANDSHAKE_TIMEOUT_S, EdgeHttpProtocol
from gateway.listener import AdmittingServer
from gateway.metrics import CONNECTIONS, CONNECTIONS_LIMIT
from gateway.tls_buffer import share_tls_read_buffer
from gateway.tls_reload import follow_cert_files, follow_gateway_ca

log = get_logger("versus.gateway")

# Uvicorn's own limits, made explicit (see docs/configuration.md). Beyond the connection limit
# new requests and handshakes get 503; each connection is one file descriptor (see raise_fd_limit).
MAX_CONCURRENT_CONNECTIONS = 15_000
# Descriptors beyond the connections: database and Redis pools, gRPC channels, logs.
FD_HEADROOM = 512
KEEPALIVE_TIMEOUT_S = 75
# A report frame carries up to 1 MiB of result, base64-encoded, plus the frame.
WS_MAX_FRAME_BYTES = 3 * 1024 * 1024
WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = 20.0


# The WebSocket settings of the gateway's uvicorn server (tests serve the app with the same).
WS_OPTIONS: dict[str, Any] = {
    # uvicorn's h11 and websockets-sansio protocols with the edge limits of gateway/edge.py; the
    # control socket served without the ASGI application (gateway/control_socket.py).
    "http": EdgeHttpProtocol,
    "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
    "ws": CollectorWebSocketProtocol,
    "ws_max_size": WS_MAX_FRAME_BYTES,
    # No compression: nothing to gain on small JSON frames or already-encrypted tunnel
    # bytes, and no decompression bombs.
    "ws_per_message_deflate": False,
    "ws_ping_interval": WS_PING_INTERVAL_S,
    "ws_ping_timeout": WS_PING_TIMEOUT_S,
}


def raise_fd_limit(wanted: int = MAX_CONCURRENT_CONNECTIONS + FD_HEADROOM) -> int:
    """Raise this process's soft open-file limit toward ``wanted`` (at most the hard limit); returns it.

    Distributions often start services with a soft limit of 1,024 descriptors, which would cap
    the gateway near a thousand collectors with "Too many open files" on accept.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open-file limit below the connection limit; raise it (ulimit -n / LimitNOFILE)",
            limit=soft,
            wanted=wanted,
        )
    return int(soft)


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves so a busy port is a clear startup error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it a held claim's response (headers, then body) waits ~40 ms on the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port} (gateway): {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def _watch_parent(server: uvicorn.Server) -> None:
    """Stop when the supervisor is gone, or a stop signal came before uvicorn's handlers were in place."""
    raw = os.environ.get(PARENT_PID_ENV)
    while not server.should_exit:
        if raw and os.getppid() != int(raw):
            log.info("supervisor exited; stopping")
            server.should_exit = True
            return
        if early_signals.requested() is not None:
            server.should_exit = True
            return
        await asyncio.sleep(0.2)


async def serve(settings: Settings) -> None:
    setup_logging(settings, "gateway")
    start_tracing("gateway")
    database_url, redis_url = require_backends(settings, "gateway")
    check_backends(database_url, redis_url)
    # The gateway takes the public material only: no private key lives on an edge host.
    follower = await material.start_service(settings, database_url, material.Role.EDGE)
    stop_following = asyncio.Event()
    following = asyncio.create_task(follower.run(stop_following)) if follower is not None else None
    # With replicas on several hosts the update repository it serves comes from PostgreSQL too.
    updates = None
    if settings.key_material is KeyMaterialMode.SHARED:
        updates = SharedDirectory(
            ensure_writable(settings.state_dir) / "updates",
            db_engine.create_sync(database_url, pool_size=1, application_name="versus-gateway-updates"),
        )
        updates_following = asyncio.create_task(updates.follow(stop_following))
    state = ensure_writable(settings.state_dir)
    store = CaStore(state)
    tls = resolve_tls(settings, store)
    bundles = BundleSource.from_settings(settings, state)
    raise_fd_limit()
    sock = bind(settings.gateway_host, settings.gateway_port)
    app = create_app(
        GatewayConfig(
            database_url=database_url,
            redis_url=redis_url,
            enrollment_address=settings.enrollment_address,
            router_address=settings.router_address,
            claim_hold_s=settings.claim_hold_s,
            socket_claim_hold_s=settings.socket_claim_hold_s,
            park_claims=settings.gateway_park_claims,
            router_streams=settings.gateway_router_streams,
            attach_host=settings.gateway_attach_host,
            attach_port=settings.gateway_attach_port,
            attach_address=settings.gateway_attach_address,
            trust_bundle=bundles.get,
            updates_dir=state / "updates",
            service_token=token_files.service_token(settings),
        )
    )
    config = uvicorn.Config(
        app,
        ssl_certfile=str(tls.cert_file) if tls else None,
        ssl_keyfile=str(tls.key_file) if tls else None,
        **WS_OPTIONS,
        lifespan="on",
        log_config=None,
        access_log=False,
        server_header=False,
        limit_concurrency=MAX_CONCURRENT_CONNECTIONS,
        timeout_keep_alive=KEEPALIVE_TIMEOUT_S,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
    # Loaded here rather than in serve() so the certificate can be swapped in the live SSL context.
    config.load()
    # The TLS context goes to the gateway's own listener, which admits before any handshake
    # (gateway/listener.py); uvicorn serves the connections it hands over.
    tls_context, config.ssl = config.ssl, None
    server = AdmittingServer(
        config,
        settings.gateway_drain_s,
        tls_context,
        AdmissionLimits(settings.gateway_max_handshakes, MAX_CONCURRENT_CONNECTIONS),
        TLS_HANDSHAKE_TIMEOUT_S,
    )
    app.state.draining = lambda: server.draining
    CONNECTIONS.set_function(lambda: float(len(server.server_state.connections)))
    CONNECTIONS_LIMIT.set(MAX_CONCURRENT_CONNECTIONS)
    reloading = None
    if tls is not None and tls_context is not None and settings.tls_cert_file is None:
        reloading = asyncio.create_task(
            follow_gateway_ca(tls_context, store, lambda: resolve_tls(settings, store), server)
        )
    elif tls is not None and tls_context is not None:
        reloading = asyncio.create_task(follow_cert_files(tls_context, tls.cert_file, tls.key_file, server))
    share_tls_read_buffer()
    edge.configure(settings.gateway_max_anonymous_per_source)
    # Uvicorn re-raises the signal it caught once it has shut down; with these recording
    # handlers in place that re-raise is harmless and the process exits 0. A signal that came
    # before uvicorn installed its own is seen by the watchdog.
    early_signals.install()
    server.should_exit = early_signals.requested() is not None
    watchdog = asyncio.create_task(_watch_parent(server))
    SERVICE_UP.labels("gateway").set(1)
    log.info("serving", service="gateway", url=settings.gateway_url, tls=tls is not None)
    try:
        await server.serve(sockets=[sock])
    finally:
        watchdog.cancel()
        stop_following.set()
        if following is not None:
            await asyncio.wait({following}, timeout=5.0)
        if updates is not None:
            await asyncio.wait({updates_following}, timeout=5.0)
            updates.engine.dispose()
        if reloading is not None:
            reloading.cancel()
        SERVICE_UP.labels("gateway").set(0)
        sock.close()
        tracing.shutdown()
    if not server.started:
        raise StartupError("gateway failed to start; see the log above")
