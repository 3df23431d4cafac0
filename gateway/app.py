"""The gateway's ASGI application.

Foundation endpoints: ``/healthz`` (the process is alive), ``/readyz``
(PostgreSQL and Redis answer within a bound) and ``/metrics`` (Prometheus).
The OpenAPI document is served at ``/openapi.json``. Every error body has the
shape ``{"error": {"code": "...", "message": "..."}}``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.exceptions import HTTPException as StarletteHTTPException

from common import error_mapping
from common.db import engine as db_engine
from common.db import writable
from common.errors import InvalidArgument, VersusError
from common.grpc.client import Token
from common.redis.client import create_async as create_redis
from common.runtime.tasks import watched_step
from common.telemetry import capacity
from common.telemetry.logs import get_logger
from common.trust.trust_bundle import Bundle
from common.tunnel.attach import attach_url
from gateway import (
    collector_api,
    collector_bodies,
    edge,
    enroll_api,
    openapi_bodies,
    openapi_errors,
    output_api,
    updates_api,
)
from gateway.auth import AdmissionGate
from gateway.body import BODY_DEADLINE_S
from gateway.clients import Backends
from gateway.middleware import RequestContextMiddleware
from gateway.parking.hub import ClaimParking
from gateway.revocations import RevocationFeed
from gateway.router_link import RouterLink
from gateway.sources import SourceCounts
from gateway.standing import sweeping
from gateway.store import GatewayStore
from gateway.tunnels import socket as tunnel_socket
from gateway.tunnels.attach import AttachListener
from gateway.tunnels.held import TunnelRegistry

# Each readiness probe of a dependency must answer within this bound.
READINESS_TIMEOUT_S = 2.0

log = get_logger("versus.gateway")


@dataclass(frozen=True)
class GatewayConfig:
    """What the gateway app needs to know about its surroundings."""

    database_url: str
    redis_url: str
    enrollment_address: str
    router_address: str = ""
    # The current trust bundle, whose gateway CAs are served at /trust (None or no gateway CA:
    # the gateway's certificate is publicly trusted).
    trust_bundle: Callable[[], Bundle] | None = None
    # The update repository served at /updates (router/releases/update_repo.py; None: no updates here).
    updates_dir: Path | None = None
    # A request body must arrive completely within this many seconds.
    body_deadline_s: float = BODY_DEADLINE_S
    # Longest a claim is held waiting for work before answering 204: over HTTPS, and on the
    # control socket (whose pings keep the connection and the collector's liveness).
    claim_hold_s: float = 25.0
    socket_claim_hold_s: float = 120.0
    # How often an open socket re-checks its collector's standing in PostgreSQL; revocations are
    # also broadcast over Redis and close sockets at once (gateway/revocations.py).
    revocation_check_s: float = 60.0
    # API token (role service) presented to the router and the enrollment service.
    service_token: Token = field(default="", repr=False)
    # Idle claims wait in the gateway instead of the router (gateway/parking/). Off: every claim
    # goes to the router, as before parking (benchmarks compare the two in one run).
    park_claims: bool = True
    # Exchange streams to the routers (gateway/router_link.py); 0: one unary call per collector call.
    router_streams: int = 2
    # The internal listener where platform ends attach to tunnel sessions (gateway/tunnels/attach.py):
    # host, port (0: any free one) and the address advertised (None: host and the bound port).
    attach_host: str = "127.0.0.1"
    attach_port: int = 0
    attach_address: Callable[[int], str] | None = None


@dataclass
class Connections:
    """Connections the gateway holds for its lifetime."""

    engine: AsyncEngine
    redis: Redis

    @classmethod
    def connect(cls, database_url: str, redis_url: str) -> Connections:
        return cls(
            engine=db_engine.create_async(
                database_url, pool_size=10, pre_ping=False, application_name="versus-gateway"
            ),
            redis=create_redis(redis_url),
        )

    async def close(self) -> None:
        await self.redis.aclose()
        await self.engine.dispose()


def watch_capacity(connections: Connections, link: RouterLink) -> None:
    """The gateway's pools and its link to the router, usage beside limit (docs/operations.md)."""
    capacity.watch_db("gateway", connections.engine)
    capacity.watch_redis("gateway", connections.redis)
    capacity.watch(
        capacity.GRPC_IN_FLIGHT, capacity.GRPC_LIMIT, ("gateway", "router_link"),
        lambda: float(link.pending()), lambda: float(link.pending_limit()),
    )  # fmt: skip


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    checks: dict[str, str]


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


async def _probe(name: str, check: Awaitable[object]) -> tuple[str, str]:
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_S):
            await check
        return name, "ok"
    except TimeoutError:
        return name, f"timed out after {READINESS_TIMEOUT_S:.0f}s"
    except writable.NotWritable:
        return name, writable.READ_ONLY
    except Exception as exc:  # any failure means not ready; the reason is reported
        return name, f"unreachable: {type(exc).__name__}"


def error_response(error: VersusError, status: int) -> JSONResponse:
    return JSONResponse(error.to_dict(), status_code=status)


def create_app(config: GatewayConfig) -> FastAPI:
    """Build the gateway app; connections open at startup and close at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.connections = Connections.connect(config.database_url, config.redis_url)
        app.state.store = GatewayStore(app.state.connections.engine)
        app.state.backends = Backends(
            config.enrollment_address, config.router_address, config.service_token, config.router_streams
        )
        watch_capacity(app.state.connections, app.state.backends.router_link)
        app.state.claim_hold_s = config.claim_hold_s
        app.state.socket_claim_hold_s = config.socket_claim_hold_s
        app.state.service_token = config.service_token
        app.state.revocation_check_s = config.revocation_check_s
        app.state.revocations = RevocationFeed(app.state.connections.redis)
        app.state.revocations.start()
        app.state.parking = ClaimParking(app.state.connections.redis)
        if config.park_claims:
            app.state.parking.start()
        app.state.admissions = AdmissionGate()
        # Each address's cap on not-yet-authenticated connections grows with its recent collectors.
        app.state.source_counts = SourceCounts(app.state.connections.redis)
        await app.state.source_counts.start()
        edge.count_sources(app.state.source_counts)
        app.state.trust_bundle = config.trust_bundle
        app.state.updates_dir = config.updates_dir
        app.state.body_deadline_s = config.body_deadline_s
        app.state.tunnels = TunnelRegistry(app.state.connections.redis, f"gw-{secrets.token_hex(8)}")
        attach = AttachListener(app.state.tunnels)
        bound = await attach.start(config.attach_host, config.attach_port)
        app.state.tunnels.attach_url = attach_url(
            config.attach_address(bound) if config.attach_address else f"{config.attach_host}:{bound}"
        )
        try:
            async with sweeping(app.state):
                yield
        finally:
            edge.stop_counting_sources(app.state.source_counts)
            # Each step watched: a shutdown seen to hang once in a test run says where next time.
            for name, step in (
                ("tunnels", app.state.tunnels.close),
                ("attach listener", attach.stop),
                ("source counts", app.state.source_counts.stop),
                ("revocations", app.state.revocations.stop),
                ("parking", app.state.parking.stop),
                ("backends", app.state.backends.close),
                ("connections", app.state.connections.close),
            ):
                await watched_step(name, step(), log)

    app = FastAPI(
        title="Versus collector gateway",
        version="1",
        summary="The only endpoint collectors talk to; every call but enroll needs an ES256 bearer token.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        responses={500: {"model": ErrorBody}},
    )
    app.add_middleware(RequestContextMiddleware)

    @app.exception_handler(VersusError)
    async def _domain_error(_: Request, exc: VersusError) -> JSONResponse:
        return error_response(exc, error_mapping.status_for(exc).http_status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        err = VersusError(str(exc.detail), code=codes.get(exc.status_code, f"http_{exc.status_code}"))
        return error_response(err, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()
        first = problems[0] if problems else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        what = str(first.get("msg", "invalid request"))
        return error_response(InvalidArgument(f"{where}: {what}" if where else what), 400)

    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        status = error_mapping.status_for(exc).http_status
        if status == 500:
            log.exception("unhandled error")
        else:
            log.warning(
                "dependency unavailable",
                error=type(exc).__name__,
                detail=error_mapping.dependency_detail(exc),
            )
        return error_response(error_mapping.public_error(exc), status)

    # Dependency errors are registered by class so Starlette answers them inside the middleware
    # stack: the access log and metrics then see the real status (503), not an unhandled 500.
    app.add_exception_handler(SQLAlchemyError, _unexpected)
    app.add_exception_handler(RedisError, _unexpected)
    app.add_exception_handler(Exception, _unexpected)

    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz() -> Health:
        """Liveness: the process is up and serving HTTP."""
        return Health(status="ok")

    @app.get(
        "/readyz",
        response_model=Readiness,
        responses={503: {"model": Readiness}},
        tags=["operations"],
    )
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: PostgreSQL and Redis both answer within the probe timeout, and the gateway
        is not draining (common/runtime/draining_server.py: a load balancer takes it out of
        rotation first)."""
        draining = getattr(request.app.state, "draining", None)
        if draining is not None and draining():
            body = Readiness(status="draining", checks={})
            return JSONResponse(body.model_dump(), status_code=503)
        connections: Connections = request.app.state.connections
        results = await asyncio.gather(
            _probe("postgres", writable.check_engine(connections.engine)),
            _probe("redis", connections.redis.ping()),
        )
        checks = dict(results)
        ready = all(v == "ok" for v in checks.values())
        body = Readiness(status="ready" if ready else "unavailable", checks=checks)
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    app.include_router(enroll_api.router)
    app.include_router(collector_api.router)
    app.include_router(output_api.router)
    app.include_router(updates_api.router)
    app.include_router(tunnel_socket.router)
    openapi_bodies.install(
        app,
        {
            "/api/collector/v1/enroll": enroll_api.EnrollBody,
            "/api/collector/v1/renew": enroll_api.RenewBody,
            "/api/collector/v1/claim": collector_bodies.ClaimBody,
            "/api/collector/v1/report": collector_bodies.ReportBody,
            "/api/collector/v1/capabilities": collector_bodies.CapabilitiesBody,
            "/api/collector/v1/bye": collector_bodies.ByeBody,
        },
        bearer_paths=[
            f"/api/collector/v1/{name}" for name in ("enrollment", "renew", "claim", "report", "capabilities")
        ],
        errors=openapi_errors.ERRORS,
    )

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
