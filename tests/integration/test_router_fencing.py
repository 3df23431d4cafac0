"""Correctness under failure in the router: the time fence, Redis loss, refusals, lost reads.

Against real PostgreSQL and Redis; the end-to-end versions with real collector processes
are in tests/e2e/test_failure_regressions.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import select, update

from common.db.schema import device_leases, dispatches, tasks
from common.envelope import wire
from common.envelope.fence import FENCE_S
from router.core.states import State
from router.dispatch.service import DeviceLeased
from tests.support.router_env import RouterEnv, make_silent, open_envelope

pytestmark = pytest.mark.timeout(60)
S = State


async def _dispatch(env: RouterEnv, op: str, target: str, key: str = "") -> tuple[str, str]:
    request = env.request(op, target=target, key=key) if key else env.request(op, target=target)
    task, _ = await env.router.submit(request)
    got = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert got is not None
    return str(task["task_id"]), got.dispatch_id


async def _task(env: RouterEnv, task_id: str) -> dict[str, object]:
    task, _ = await env.router.get(task_id)
    return dict(task)


async def test_a_mutation_envelope_is_short_lived(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    _, dispatch_id = await _dispatch(env, "set", "dev-short")
    async with env.router.engine.connect() as conn:
        row = (await conn.execute(select(dispatches).where(dispatches.c.dispatch_id == dispatch_id))).one()
    # The claim window plus the operation's timeout, not the general five-minute ttl - counted from
    # when the envelope was signed (its not_before), not from the row's created_at: that is the
    # transaction's start, which a busy machine can put a second or more before the signing.
    fields = wire.decode(bytes(row.envelope)).fields
    assert fields.expires_at - fields.not_before <= 60 + 60
    assert int(row.expires_at.timestamp()) == fields.expires_at


async def test_a_silent_holder_fences_its_device(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "set", "dev-f")
    await make_silent(env, "col-a")
    await env.router.sweep()
    assert (await _task(env, task_id))["state"] == "indeterminate"
    async with env.router.engine.connect() as conn:
        lease = (await conn.execute(select(device_leases).where(device_leases.c.target_ref == "dev-f"))).one()
        expires = (
            await conn.execute(select(dispatches.c.expires_at).where(dispatches.c.dispatch_id == dispatch_id))
        ).scalar_one()
    assert lease.holder_task_id is None
    # Released, but fenced until the silent holder's envelope can no longer run.
    assert lease.fenced_until == expires + dt.timedelta(seconds=FENCE_S)
    with pytest.raises(DeviceLeased) as refused:
        await env.router.submit(env.request("set", target="dev-f", key="second"))
    assert "fenced until" in refused.value.message
    # Once the fence has passed (and the holder is back) the device is free again.
    await env.router.liveness.redis.zadd("versus:live", {"col-a": dt.datetime.now(dt.UTC).timestamp()})
    async with env.router.engine.begin() as conn:
        await conn.execute(
            update(device_leases).where(device_leases.c.target_ref == "dev-f").values(fenced_until=None)
        )
    task, _ = await env.router.submit(env.request("set", target="dev-f", key="second"))
    assert task["state"] == "leased"


async def test_a_reported_outcome_leaves_no_fence(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    _, dispatch_id = await _dispatch(env, "set", "dev-reported")
    await env.router.report("col-a", dispatch_id, S.SUCCESS)
    task, _ = await env.router.submit(env.request("set", target="dev-reported", key="next"))
    assert task["state"] == "leased"


async def test_the_reconcile_read_waits_for_the_fence(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, _ = await _dispatch(env, "apply", "dev-wait")
    await make_silent(env, "col-a")
    await env.router.sweep()
    task = await _task(env, task_id)
    # A "not applied" read now could be overtaken by the silent holder's write: wait.
    assert task["state"] == "unknown" and task["retry_at"] is not None
    assert await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0) is None
    await env.router.liveness.redis.zadd("versus:live", {"col-a": dt.datetime.now(dt.UTC).timestamp()})
    async with env.router.engine.begin() as conn:
        await conn.execute(
            update(tasks).where(tasks.c.task_id == task_id).values(retry_at=dt.datetime.now(dt.UTC))
        )
    await env.router.sweep()
    assert (await _task(env, task_id))["state"] == "reconciling"
    check = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert check is not None and open_envelope(check.envelope, "col-a")["operation"] == "apply.check"


async def test_redis_flush_makes_liveness_unknown_not_dead(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, _ = await _dispatch(env, "set", "dev-flush")
    await env.router.sweep()  # the fleet has been tracked for a while
    await env.router.redis.flushall()
    counts = await env.router.sweep()
    assert counts["unknown"] == 0
    assert (await _task(env, task_id))["state"] == "dispatched"


async def test_a_collector_specific_refusal_goes_elsewhere_once(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "echo", "dev-clock")
    await env.add_collector("col-b")
    result = await env.router.report("col-a", dispatch_id, S.FAILED, error_code="expired", refused=True)
    assert result.state in (S.QUEUED, S.LEASED)
    assert await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0) is None
    # Re-placing a queued task runs beside the report's answer: col-b's claim waits for it (it is
    # woken the moment the task is routed to it) instead of assuming it already happened.
    again = await env.router.claim("col-b", claim_seq=0, held_task_ids=frozenset(), wait_s=5)
    assert again is not None
    # col-b refuses too: nobody else is left, so it waits in the queue (until its deadline), no loop.
    await env.router.report("col-b", again.dispatch_id, S.FAILED, error_code="not_yet_valid", refused=True)
    task = await _task(env, task_id)
    assert (task["state"], task["attempts"]) == ("queued", 2)


async def test_a_permanent_refusal_fails_the_task(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "set", "dev-kid")
    result = await env.router.report("col-a", dispatch_id, S.FAILED, error_code="unknown_kid", refused=True)
    assert result.state == S.FAILED
    task = await _task(env, task_id)
    assert (task["state"], task["error_code"]) == ("failed", "envelope_refused:unknown_kid")
    # Never run, so the device is free at once.
    nxt, _ = await env.router.submit(env.request("set", target="dev-kid", key="after-refusal"))
    assert nxt["state"] == "leased"


async def test_a_replayed_task_refusal_changes_nothing(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "set", "dev-replay")
    await env.router.report("col-a", dispatch_id, S.FAILED, error_code="replayed_task", refused=True)
    assert (await _task(env, task_id))["state"] == "dispatched"
    assert (await env.router.report("col-a", dispatch_id, S.SUCCESS)).state == S.SUCCESS


async def test_a_lost_reconcile_read_is_sent_again_within_bounds(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "apply", "dev-lostcheck")
    await env.add_collector("col-b")
    await env.router.report("col-a", dispatch_id, S.UNKNOWN)
    for n in range(3):
        holder = ""
        for cid in ("col-a", "col-b"):
            check = await env.router.claim(cid, claim_seq=0, held_task_ids=frozenset(), wait_s=0)
            if check is not None:
                assert open_envelope(check.envelope, cid)["operation"] == "apply.check"
                holder = cid
        assert holder
        await make_silent(env, holder)  # the reconcile-read's holder goes silent: the read is lost
        await env.router.sweep()
        await env.router.liveness.redis.zadd("versus:live", {holder: dt.datetime.now(dt.UTC).timestamp()})
        assert (await _task(env, task_id))["state"] == ("reconciling" if n < 2 else "indeterminate")


async def test_capacity_and_drain_ride_the_claim(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    await env.router.submit(env.request("echo", target="dev-cap"))

    async def claim(**kw: Any) -> int:
        got = (
            await env.router.claim_with_offers(
                "col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0, **kw
            )
        ).claimed
        return len(got)

    # No free slot for the provider, or draining: nothing is handed out (and the dispatch stays leased).
    assert await claim(free_slots={"stub": 0}) == 0
    assert await claim(free_slots={"other": 3}) == 0
    assert await claim(draining=True) == 0
    assert await claim(free_slots={"stub": 1}) == 1
