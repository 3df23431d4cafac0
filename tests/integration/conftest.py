"""Fixtures shared by the router's integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.router_env import RouterEnv, make_router


@pytest.fixture
async def env(database_url: str, redis_url: str) -> AsyncIterator[RouterEnv]:
    """A router on a fresh database and Redis database, with helpers to add collectors and requests."""
    router = make_router(database_url, redis_url)
    yield RouterEnv(router)
    await router.aclose()
