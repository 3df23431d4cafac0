"""After `keys rotate --set dispatch`, every collector still gets envelopes it can verify.

Collectors learn the dispatch key set only at enrollment (in-band rotation is a later
milestone), so the router signs each envelope with a key that envelope's collector was
given, and keeps out of placement a collector that holds none the router still has.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import update

from common.db.schema import collectors
from common.trust.keys import KeyPurpose, KeySet
from router.dispatch.service import NO_KEY_HELD
from tests.support.router_env import RouterEnv, make_router, open_envelope

pytestmark = pytest.mark.timeout(60)

ENROLLED = KeySet.create(KeyPurpose.DISPATCH, int(time.time()))  # what col-a was given
ROTATED = ENROLLED.rotate(int(time.time()))  # what the router holds after a rotation


@pytest.fixture
async def rotated(database_url: str, redis_url: str) -> AsyncIterator[RouterEnv]:
    router = make_router(database_url, redis_url, keys=lambda: ROTATED)
    yield RouterEnv(router)
    await router.aclose()


async def _holds(env: RouterEnv, collector_id: str, kids: list[str] | None) -> None:
    async with env.router.engine.begin() as conn:
        await conn.execute(
            update(collectors).where(collectors.c.collector_id == collector_id).values(dispatch_kids=kids)
        )
    env.router.candidates.invalidate()


async def _kid_of_claim(env: RouterEnv, collector_id: str, seq: int, holds: KeySet) -> str:
    got = await env.router.claim(collector_id, claim_seq=seq, held_task_ids=frozenset(), wait_s=0)
    assert got is not None
    open_envelope(got.envelope, collector_id, holds)  # verifies with only the keys it holds
    return str(json.loads(got.envelope)["kid"])


async def test_each_envelope_is_signed_with_a_key_its_collector_holds(rotated: RouterEnv) -> None:
    env = rotated
    assert ROTATED.current_kid != ENROLLED.current_kid
    await env.add_collector("col-a")
    await _holds(env, "col-a", [ENROLLED.current_kid])
    await env.router.submit(env.request("echo", key="k-old"))
    assert await _kid_of_claim(env, "col-a", 1, ENROLLED) == ENROLLED.current_kid

    # Enrolled after the rotation: it holds both, and gets the current key.
    await _holds(env, "col-a", [ROTATED.current_kid, ENROLLED.current_kid])
    await env.router.submit(env.request("echo", key="k-new"))
    assert await _kid_of_claim(env, "col-a", 2, ROTATED) == ROTATED.current_kid


async def test_a_collector_holding_no_live_key_gets_no_work(rotated: RouterEnv) -> None:
    env = rotated
    await env.add_collector("col-a")
    await _holds(env, "col-a", ["dsp-20200101-retired"])
    task, _ = await env.router.submit(env.request("echo"))
    assert (task["state"], task["condition"]) == ("queued", NO_KEY_HELD)
    # Enrolled before kids were recorded (NULL): signed with the current key, as before.
    await _holds(env, "col-a", None)
    await env.router.reevaluate()
    assert await _kid_of_claim(env, "col-a", 1, ROTATED) == ROTATED.current_kid
