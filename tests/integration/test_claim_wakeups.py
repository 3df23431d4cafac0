"""A held claim listens from its first step: a revoke that lands while the claim is still reading
the collector's standing and recording its heartbeat ends the claim at once, not at its timeout."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import update

from common.db.schema import collectors
from common.errors import Unauthenticated
from tests.support.router_env import RouterEnv

pytestmark = pytest.mark.timeout(30)
HOLD_S = 5.0


async def test_a_revoke_during_the_claims_heartbeat_wakes_it(env: RouterEnv) -> None:
    await env.add_collector("col-1")
    router = env.router
    heartbeat = router.liveness.heartbeat

    async def revoked_meanwhile(*args: Any, **kwargs: Any) -> Any:
        # The claim read an active collector a moment ago; now it is revoked and told so.
        async with router.engine.begin() as conn:
            await conn.execute(
                update(collectors).where(collectors.c.collector_id == "col-1").values(status="revoked")
            )
        await router.wake.publish("col-1")
        await asyncio.sleep(0.2)  # the wake-up arrives while the claim is still here
        return await heartbeat(*args, **kwargs)

    router.liveness.heartbeat = revoked_meanwhile  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(Unauthenticated, match="revoked"):
        await router.claim("col-1", claim_seq=1, held_task_ids=frozenset(), wait_s=HOLD_S)
    assert time.monotonic() - started < HOLD_S / 2
