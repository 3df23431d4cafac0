"""Router replicas on one Redis: a change one of them makes to candidates reaches the others' caches."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.router_env import RouterEnv, make_router

pytestmark = pytest.mark.timeout(30)


async def test_a_change_on_one_replica_clears_the_candidate_cache_of_another(
    env: RouterEnv, database_url: str, redis_url: str
) -> None:
    other = make_router(database_url, redis_url)
    try:
        await env.add_collector("col-1")
        await asyncio.sleep(0.2)  # both subscriptions are in place, and add_collector's broadcast passed
        async with other.engine.connect() as conn:
            found = await other.candidates.load(conn, env.site_id, env.tenant_id, "stub")
        assert [c.collector_id for c in found] == ["col-1"]
        assert other.candidates._rows, "the other replica cached the site's rows"
        env.router.candidates_changed()
        for _ in range(250):  # up to 5 s
            if not other.candidates._rows:
                break
            await asyncio.sleep(0.02)
        assert not other.candidates._rows
    finally:
        await other.aclose()
