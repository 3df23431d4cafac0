"""The gateway app against real PostgreSQL and Redis (in-process ASGI, real backends)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from common.embedded.process import free_port
from gateway.app import GatewayConfig, create_app


@pytest.fixture
async def client_for() -> AsyncIterator[object]:
    stack: list[tuple[FastAPI, object]] = []

    async def make(database_url: str, redis_url: str) -> httpx.AsyncClient:
        app = create_app(GatewayConfig(database_url, redis_url, enrollment_address="127.0.0.1:1"))
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        stack.append((app, lifespan))
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")

    yield make
    for _, lifespan in reversed(stack):
        await lifespan.__aexit__(None, None, None)  # type: ignore[attr-defined]


async def test_healthz_and_readyz(client_for, database_url: str, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    async with await client_for(database_url, redis_url) as client:
        health = await client.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "checks": {"postgres": "ok", "redis": "ok"}}


async def test_readyz_is_503_when_redis_is_unreachable(client_for, database_url: str) -> None:  # type: ignore[no-untyped-def]
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    async with await client_for(database_url, dead_redis) as client:
        ready = await client.get("/readyz")
        body = ready.json()
        assert ready.status_code == 503
        assert body["status"] == "unavailable"
        assert body["checks"]["postgres"] == "ok"
        assert body["checks"]["redis"].startswith("unreachable")
        # Liveness is unaffected by a dependency outage.
        assert (await client.get("/healthz")).status_code == 200


async def test_readyz_is_503_when_postgres_is_unreachable(client_for, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    dead_pg = f"postgresql://postgres@127.0.0.1:{free_port()}/versus"
    async with await client_for(dead_pg, redis_url) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["redis"] == "ok"
        assert ready.json()["checks"]["postgres"] != "ok"


async def test_errors_have_stable_shape_and_request_id_is_echoed(  # type: ignore[no-untyped-def]
    client_for, database_url: str, redis_url: str
) -> None:
    async with await client_for(database_url, redis_url) as client:
        missing = await client.get("/api/collector/v1/nope", headers={"x-request-id": "trace-42"})
        assert missing.status_code == 404
        assert missing.json() == {"error": {"code": "not_found", "message": "Not Found"}}
        assert missing.headers["x-request-id"] == "trace-42"
        wrong_method = await client.post("/healthz")
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"]["code"] == "method_not_allowed"
        minted = await client.get("/healthz", headers={"x-request-id": "has space"})
        assert len(minted.headers["x-request-id"]) == 32


async def test_metrics_and_openapi_are_published(client_for, database_url: str, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    async with await client_for(database_url, redis_url) as client:
        await client.get("/healthz")
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert 'versus_http_requests_total{method="GET",route="/healthz",status="200"}' in metrics.text
        spec = (await client.get("/openapi.json")).json()
        assert {"/healthz", "/readyz"} <= set(spec["paths"])
        assert "/metrics" not in spec["paths"]
