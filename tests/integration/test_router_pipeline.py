"""The Task Router pipeline on real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from sqlalchemy import func, select, text, update

from common.db.schema import collectors, device_leases, dispatches, tasks
from common.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
)
from common.redis.keys import WORK
from router.core.states import State
from router.dispatch import sql_tasks
from router.dispatch.placement import OpClassMismatch, _rendezvous
from router.dispatch.service import DeviceLeased
from tests.support.router_env import RouterEnv, make_silent, open_envelope

pytestmark = pytest.mark.timeout(60)
S = State


async def _state(env: RouterEnv, task_id: str) -> str:
    task, _ = await env.router.get(task_id)
    return str(task["state"])


async def _settle(env: RouterEnv) -> None:
    """Let post-commit background work (re-placement) finish."""
    for _ in range(50):
        if not env.router._background:
            return
        await asyncio.sleep(0.02)


async def test_read_is_placed_claimed_and_verifies(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    request = env.request("echo")
    task, existing = await env.router.submit(request)
    assert not existing and task["state"] == "leased"
    # The same request again is the same task, and writes nothing (not even history).
    again_task, again_existing = await env.router.submit(request)
    assert again_existing and again_task["task_id"] == task["task_id"]
    got = await env.router.claim("col-a", claim_seq=1, held_task_ids=frozenset(), wait_s=0)
    assert got is not None
    envelope = open_envelope(got.envelope, "col-a")
    assert envelope["task_id"] == got.dispatch_id
    assert envelope["idempotency_key"] == task["idempotency_key"]
    assert envelope["lease_epoch"] == 0  # reads take no lease
    assert await env.history(task["task_id"]) == [
        ("queued", "queued"), ("queued", "routed"), ("routed", "leased"), ("leased", "dispatched"),
    ]  # fmt: skip
    result = await env.router.report("col-a", got.dispatch_id, S.SUCCESS, b"ok")
    assert (result.duplicate, result.state) == (False, S.SUCCESS)
    again = await env.router.report("col-a", got.dispatch_id, S.SUCCESS, b"ok")
    assert again.duplicate
    with pytest.raises(Conflict, match="different terminal report"):
        await env.router.report("col-a", got.dispatch_id, S.FAILED, b"no")
    with pytest.raises(PermissionDenied):
        await env.router.report("col-other", got.dispatch_id, S.SUCCESS, b"ok")


async def test_no_eligible_collector_waits_and_is_placed_when_one_appears(env: RouterEnv) -> None:
    task, _ = await env.router.submit(env.request("echo"))
    assert (task["state"], task["condition"]) == ("queued", "no_eligible_collector")
    await env.add_collector("col-late")
    await _settle(env)
    assert await _state(env, task["task_id"]) == "leased"


async def test_claim_returns_within_milliseconds_of_routing(env: RouterEnv) -> None:
    await env.add_collector("col-w")
    waiting = asyncio.create_task(env.router.claim("col-w", claim_seq=1, held_task_ids=frozenset(), wait_s=5))
    await asyncio.sleep(0.2)
    started = asyncio.get_running_loop().time()
    await env.router.submit(env.request("echo"))
    got = await waiting
    assert got is not None
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_idempotent_submit(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    first, _ = await env.router.submit(env.request("echo", key="k-1"))
    same, existing = await env.router.submit(env.request("echo", key="k-1"))
    assert existing and same["task_id"] == first["task_id"]
    with pytest.raises(Conflict) as info:
        await env.router.submit(env.request("echo", key="k-1", target_ref="dev-9"))
    assert info.value.code == "idempotency_key_reused"


async def test_op_class_lie_is_refused_and_writes_nothing(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    with pytest.raises(OpClassMismatch):
        await env.router.submit(env.request("set", op_class="read", key="lie"))
    async with env.router.engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(tasks))).scalar_one() == 0


async def test_device_lease_refuses_a_second_mutation(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    first, _ = await env.router.submit(env.request("set", target="sw-1"))
    with pytest.raises(DeviceLeased) as info:
        await env.router.submit(env.request("set", target="sw-1"))
    assert first["task_id"] in info.value.message
    # Reads and parallel-safe operations bypass the lease; other devices are unaffected.
    assert (await env.router.submit(env.request("echo", target="sw-1")))[0]["state"] == "leased"
    assert (await env.router.submit(env.request("tag", target="sw-1")))[0]["state"] == "leased"
    assert (await env.router.submit(env.request("set", target="sw-2")))[0]["state"] == "leased"
    async with env.router.engine.connect() as conn:
        count = await conn.execute(
            select(func.count()).select_from(tasks).where(tasks.c.target_ref == "sw-1")
        )
        assert count.scalar_one() == 3  # the refused one was never written


async def test_lease_epoch_only_grows(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    epochs = []
    for _ in range(3):
        await env.router.submit(env.request("set", target="sw-e"))
        got = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
        assert got is not None
        epochs.append(open_envelope(got.envelope, "col-a")["lease_epoch"])
        await env.router.report("col-a", got.dispatch_id, S.SUCCESS, b"")
    assert epochs == [1, 2, 3]


async def test_capacity_is_respected_and_freed_work_is_placed(env: RouterEnv) -> None:
    await env.add_collector("col-1", max_concurrency=1)
    first, _ = await env.router.submit(env.request("echo", target="a"))
    second, _ = await env.router.submit(env.request("echo", target="b"))
    assert (first["state"], second["state"]) == ("leased", "queued")
    got = await env.router.claim("col-1", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert got is not None
    await env.router.report("col-1", got.dispatch_id, S.SUCCESS, b"")
    await _settle(env)
    assert await _state(env, second["task_id"]) == "leased"


async def test_a_freed_slot_skips_a_head_of_queue_task_it_cannot_take(env: RouterEnv) -> None:
    # The oldest queued task needs a FIPS collector nobody has; the next one fits the freed slot.
    await env.add_collector("col-1", max_concurrency=1)
    first, _ = await env.router.submit(env.request("echo", target="a"))
    fips, _ = await env.router.submit(env.request("echo", target="b", requires_fips=True))
    plain, _ = await env.router.submit(env.request("echo", target="c"))
    assert (first["state"], fips["state"], plain["state"]) == ("leased", "queued", "queued")
    got = await env.router.claim("col-1", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert got is not None
    await env.router.report("col-1", got.dispatch_id, S.SUCCESS, b"")
    await _settle(env)
    assert await _state(env, plain["task_id"]) == "leased"
    assert await _state(env, fips["task_id"]) == "queued"


def _target_preferring(first: str, second: str) -> str:
    """A device name whose rendezvous hash picks ``first`` over ``second`` at equal load."""
    return next(t for i in range(1000) if _rendezvous(t := f"dev-{i}", first) > _rendezvous(t, second))


async def test_a_freed_slot_goes_to_the_collector_that_freed_it(env: RouterEnv) -> None:
    # Two collectors are free when the queued task is placed: one freed its slot by reporting,
    # the other's slot emptied unnoticed. The report's slot is offered to the task first, even
    # though the task's device would land on the other collector if both were asked.
    await env.add_collector("col-a", max_concurrency=1)
    await env.add_collector("col-b", max_concurrency=1)
    for target in ("x", "y"):
        assert (await env.router.submit(env.request("echo", target=target)))[0]["state"] == "leased"
    queued, _ = await env.router.submit(env.request("echo", target=_target_preferring("col-b", "col-a")))
    assert queued["state"] == "queued"
    got = {
        cid: await env.router.claim(cid, claim_seq=0, held_task_ids=frozenset(), wait_s=0)
        for cid in ("col-a", "col-b")
    }
    async with env.router.engine.begin() as conn:
        await conn.execute(
            update(dispatches).where(dispatches.c.collector_id == "col-b").values(state="success")
        )
    await env.router.in_flight.add("col-b", "stub", -1)
    reported = got["col-a"]
    assert reported is not None
    await env.router.report("col-a", reported.dispatch_id, S.SUCCESS, b"")
    await _settle(env)
    task, _ = await env.router.get(queued["task_id"])
    assert task["state"] == "leased"
    async with env.router.engine.connect() as conn:
        placed_on = await conn.scalar(
            select(dispatches.c.collector_id).where(dispatches.c.dispatch_id == task["current_dispatch_id"])
        )
    assert placed_on == "col-a"


async def test_a_slot_another_placement_is_filling_is_not_contested(env: RouterEnv) -> None:
    # While a placement of this process holds col-b's one slot (it is leasing there and Redis does
    # not count it yet), a submit goes to col-a instead of locking col-b and finding it full.
    await env.add_collector("col-a", max_concurrency=1)
    await env.add_collector("col-b", max_concurrency=1)
    release = env.router.candidates.reservations.hold("col-b", "stub")
    task, _ = await env.router.submit(env.request("echo", target=_target_preferring("col-b", "col-a")))
    release()
    async with env.router.engine.connect() as conn:
        placed_on = await conn.scalar(
            select(dispatches.c.collector_id).where(dispatches.c.dispatch_id == task["current_dispatch_id"])
        )
    assert placed_on == "col-a"
    assert env.router.candidates.reservations.held("stub") == {}  # the submit's own hold ended


async def test_a_batch_member_missing_from_the_next_claim_is_placed_again(env: RouterEnv) -> None:
    await env.add_collector("col-1")
    tasks = [(await env.router.submit(env.request("echo", target=f"t{i}")))[0] for i in range(3)]
    got = (
        await env.router.claim_with_offers(
            "col-1", claim_seq=1, held_task_ids=frozenset(), wait_s=0, max_dispatches=5
        )
    ).claimed
    assert len(got) == 3
    assert [open_envelope(c.envelope, "col-1")["idempotency_key"] for c in got] == [
        t["idempotency_key"] for t in tasks
    ]
    # The next claim holds the first two only: the third never arrived and goes back to the queue.
    held = frozenset(c.dispatch_id for c in got[:2])
    again = (
        await env.router.claim_with_offers(
            "col-1", claim_seq=2, held_task_ids=held, wait_s=0, max_dispatches=5
        )
    ).claimed
    assert len(again) == 1 and again[0].dispatch_id not in {c.dispatch_id for c in got}
    assert [await _state(env, t["task_id"]) for t in tasks] == ["dispatched"] * 3
    assert ("dispatched", "queued") in await env.history(tasks[2]["task_id"])


async def test_a_newer_claim_ends_an_abandoned_one_so_work_goes_to_the_live_claim(env: RouterEnv) -> None:
    # A collector that hung up while its claim was held sends the next numbered claim; the one still
    # held here used to take the next task and hand it to nobody, and the task waited a whole hold
    # for the collector's following claim to prove it never arrived.
    await env.add_collector("col-1")
    abandoned = asyncio.create_task(
        env.router.claim("col-1", claim_seq=7, held_task_ids=frozenset(), wait_s=10)
    )
    await asyncio.sleep(0.3)
    live = asyncio.create_task(env.router.claim("col-1", claim_seq=8, held_task_ids=frozenset(), wait_s=10))
    assert await asyncio.wait_for(abandoned, 2) is None
    task, _ = await env.router.submit(env.request("echo"))
    got = await asyncio.wait_for(live, 5)
    assert got is not None
    assert open_envelope(got.envelope, "col-1")["task_id"] == task["current_dispatch_id"]


async def test_a_queue_pass_never_locks_a_leased_task_against_its_claim(env: RouterEnv) -> None:
    # A re-evaluation pass looks at task ids read a moment earlier; one may have been leased since.
    # Locking it then, however briefly, made the collector's claim skip it (SKIP LOCKED) and wait
    # out its whole hold for a wake-up that had already been sent.
    await env.add_collector("col-1")
    task, _ = await env.router.submit(env.request("echo", target="a"))
    assert task["state"] == "leased"
    async with env.router.engine.begin() as conn:
        assert await sql_tasks.lock_if_queued(conn, task["task_id"]) is None
        got = await env.router.claim("col-1", claim_seq=1, held_task_ids=frozenset(), wait_s=0)
    assert got is not None


async def _claim_meeting_a_lock_in_passing(env: RouterEnv, *, announce_while_held: bool) -> None:
    """A leased task's row is locked by another transaction while the collector claims; once the
    lock goes, the claim must take the task within a second or two, not wait out its hold."""
    await env.add_collector("col-1")
    task, _ = await env.router.submit(env.request("echo", target="a"))
    assert task["state"] == "leased"
    await asyncio.sleep(0.2)  # the wake-up for it has come back from Redis; nobody was listening
    async with env.router.engine.begin() as blocker:
        await blocker.execute(
            text("SELECT 1 FROM tasks WHERE task_id = :t FOR UPDATE"), {"t": task["task_id"]}
        )
        held = asyncio.create_task(
            env.router.claim("col-1", claim_seq=1, held_task_ids=frozenset(), wait_s=20)
        )
        await asyncio.sleep(0.2)
        if announce_while_held:
            await env.router.wake.publish("col-1", WORK)
            await asyncio.sleep(0.1)
        assert not held.done()
    got = await asyncio.wait_for(held, 3)
    assert got is not None and got.dispatch_id == task["current_dispatch_id"]


async def test_a_claim_woken_for_work_looks_again_when_the_task_was_locked_in_passing(env: RouterEnv) -> None:
    # A queue pass whose snapshot still saw the task queued locks the version that is leased now
    # (PostgreSQL locks the newest version before it re-checks the condition, and keeps the lock)
    # until it commits; the take skips locked rows. The woken claim used to wait out its hold.
    await _claim_meeting_a_lock_in_passing(env, announce_while_held=True)


async def test_a_claim_arriving_just_after_its_work_was_announced_looks_again_too(env: RouterEnv) -> None:
    # The same lock, met by a claim that arrives just after the wake-up for its work went out (no
    # claim was listening): it has no wake-up to come, so it also looks again shortly.
    await _claim_meeting_a_lock_in_passing(env, announce_while_held=False)


async def test_a_work_wake_skips_the_standing_check_and_any_other_wake_runs_it(env: RouterEnv) -> None:
    await env.add_collector("col-1")
    held = asyncio.create_task(env.router.claim("col-1", claim_seq=1, held_task_ids=frozenset(), wait_s=10))
    await asyncio.sleep(0.3)
    async with env.router.engine.begin() as conn:  # revoked behind the router's back: no wake-up
        await conn.execute(
            update(collectors).where(collectors.c.collector_id == "col-1").values(status="revoked")
        )
    await env.router.wake.publish("col-1", WORK)
    await asyncio.sleep(0.3)
    assert not held.done()  # new work only: no database read of the collector's standing
    await env.router.wake.publish("col-1")
    with pytest.raises(Unauthenticated, match="revoked"):
        await asyncio.wait_for(held, 5)


async def test_a_lost_connection_surfaces_as_itself_not_as_a_rollback_error(env: RouterEnv) -> None:
    # Found by chaos/: after a database restart the task wake-up hook touched the invalidated
    # connection during rollback, and PendingRollbackError (an internal error) hid the real,
    # retryable one.
    class Lost(Exception):
        pass

    async def lose_the_connection() -> None:
        async with env.router.engine.begin() as conn:
            await conn.execute(select(1))
            await conn.invalidate()
            raise Lost

    with pytest.raises(Lost):
        await lose_the_connection()


async def test_a_collector_revoked_a_moment_ago_gets_no_work(env: RouterEnv) -> None:
    # Placement reuses a site's candidate rows for a second; the lock taken before leasing
    # re-checks the collector in PostgreSQL.
    await env.add_collector("col-1")
    warm, _ = await env.router.submit(env.request("echo", target="a"))
    assert warm["state"] == "leased"
    async with env.router.engine.begin() as conn:
        await conn.execute(
            update(collectors).where(collectors.c.collector_id == "col-1").values(status="revoked")
        )
    task, _ = await env.router.submit(env.request("echo", target="b"))
    assert (task["state"], task["condition"]) == ("queued", "no_eligible_collector")


async def _dispatch(env: RouterEnv, op: str, target: str) -> tuple[str, str]:
    task, _ = await env.router.submit(env.request(op, target=target))
    got = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert got is not None
    return task["task_id"], got.dispatch_id


async def test_unknown_read_is_retried_with_the_same_key(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "echo", "dev-r")
    await env.router.report("col-a", dispatch_id, S.UNKNOWN, error_code="timeout")
    assert await _state(env, task_id) in ("queued", "leased")
    await _settle(env)
    retry = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert retry is not None and retry.dispatch_id != dispatch_id
    first_key = open_envelope(retry.envelope, "col-a")["idempotency_key"]
    task, _ = await env.router.get(task_id)
    assert first_key == task["idempotency_key"]
    assert task["attempts"] == 2


async def test_unknown_terminal_mutation_goes_to_the_operator(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "set", "dev-t")
    result = await env.router.report("col-a", dispatch_id, S.UNKNOWN, error_code="conn_reset")
    assert result.state == S.INDETERMINATE
    async with env.router.engine.connect() as conn:
        holder = await conn.execute(
            select(device_leases.c.holder_task_id).where(device_leases.c.target_ref == "dev-t")
        )
        assert holder.scalar_one() is None  # the lease is released
    with pytest.raises(FailedPrecondition):
        await env.router.resolve(task_id, S.QUEUED, "x", "alice")
    resolved = await env.router.resolve(task_id, S.SUCCESS, "checked on the device", "alice")
    assert (resolved["state"], resolved["resolved_by"]) == ("success", "alice")


async def test_unknown_reconcilable_mutation_reconciles(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "apply", "dev-c")
    assert (await env.router.report("col-a", dispatch_id, S.UNKNOWN)).state == S.RECONCILING
    check = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert check is not None
    envelope = open_envelope(check.envelope, "col-a")
    assert (envelope["operation"], envelope["op_class"]) == ("apply.check", "read")
    # Not applied: retried as a new execution attempt, still holding the device.
    assert (await env.router.report("col-a", check.dispatch_id, S.FAILED)).state == S.LEASED
    retry = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert retry is not None and open_envelope(retry.envelope, "col-a")["operation"] == "apply"
    assert (await env.router.report("col-a", retry.dispatch_id, S.UNKNOWN)).state == S.RECONCILING
    check = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert check is not None
    # Applied: the task succeeded without running it again.
    assert (await env.router.report("col-a", check.dispatch_id, S.SUCCESS, b"present")).state == S.SUCCESS
    assert (await env.router.get(task_id))[0]["evidence"] == "reconciled: applied"


async def test_reconcile_not_applied_after_max_attempts_fails(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "apply", "dev-m")
    for _ in range(3):
        await env.router.report("col-a", dispatch_id, S.UNKNOWN)
        check = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
        assert check is not None
        state = (await env.router.report("col-a", check.dispatch_id, S.FAILED)).state
        if state != S.LEASED:
            break
        retry = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
        assert retry is not None
        dispatch_id = retry.dispatch_id
    # Every reconcile-read said "not applied": the change is known not to have landed.
    task = (await env.router.get(task_id))[0]
    assert (task["state"], task["error_code"], task["attempts"]) == ("failed", "not_applied", 3)


async def test_an_inconclusive_reconcile_read_is_asked_again_then_indeterminate(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "apply", "dev-inconclusive")
    await env.router.report("col-a", dispatch_id, S.UNKNOWN)
    for n in range(3):
        check = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
        assert check is not None and open_envelope(check.envelope, "col-a")["operation"] == "apply.check"
        # A read that failed with an error code says nothing about the device.
        state = (
            await env.router.report("col-a", check.dispatch_id, S.FAILED, error_code="ssh_unreachable")
        ).state
        assert state == (S.RECONCILING if n < 2 else S.INDETERMINATE)
    assert (await env.router.get(task_id))[0]["attempts"] == 1  # never retried blind


@pytest.mark.parametrize("stage", ["queued", "leased", "dispatched", "running", "success"])
async def test_cancel_at_each_state(env: RouterEnv, stage: str) -> None:
    if stage != "queued":
        await env.add_collector("col-a")
    task, _ = await env.router.submit(env.request("set", target=f"dev-{stage}"))
    if stage in ("dispatched", "running", "success"):
        got = await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0)
        assert got is not None
        if stage != "dispatched":
            await env.router.report("col-a", got.dispatch_id, S.RUNNING if stage == "running" else S.SUCCESS)
    assert await _state(env, task["task_id"]) == stage
    if stage in ("queued", "leased"):
        cancelled = await env.router.cancel(task["task_id"], "no longer needed")
        assert cancelled["state"] == "cancelled"
        if stage == "leased":  # (when queued there is no collector at all)
            assert await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0) is None
        async with env.router.engine.connect() as conn:
            held = await conn.execute(
                select(device_leases.c.holder_task_id).where(device_leases.c.target_ref == f"dev-{stage}")
            )
            assert held.scalar_one_or_none() is None
    else:
        with pytest.raises(FailedPrecondition) as info:
            await env.router.cancel(task["task_id"], "too late")
        # A collector that took it under protocol 1 cannot be asked to stop; finished work is done.
        assert info.value.code == ("not_cancellable" if stage == "success" else "cancel_unsupported")
        assert await _state(env, task["task_id"]) == stage


async def test_never_received_dispatch_is_rerouted_even_when_terminal(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task, _ = await env.router.submit(env.request("set", target="dev-nr"))
    lost = await env.router.claim("col-a", claim_seq=7, held_task_ids=frozenset(), wait_s=0)
    assert lost is not None
    # The collector's next claim does not list the dispatch: it never got it.
    again = await env.router.claim("col-a", claim_seq=8, held_task_ids=frozenset(), wait_s=0)
    assert again is not None and again.dispatch_id != lost.dispatch_id
    assert open_envelope(again.envelope, "col-a")["lease_epoch"] == 2
    history = await env.history(task["task_id"])
    assert ("dispatched", "queued") in history


async def test_held_dispatch_is_not_rerouted(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task, _ = await env.router.submit(env.request("set", target="dev-h"))
    got = await env.router.claim("col-a", claim_seq=3, held_task_ids=frozenset(), wait_s=0)
    assert got is not None
    assert (
        await env.router.claim("col-a", claim_seq=4, held_task_ids=frozenset({got.dispatch_id}), wait_s=0)
        is None
    )
    assert await _state(env, task["task_id"]) == "dispatched"
    # Unnumbered claims prove nothing either.
    assert await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0) is None
    assert await _state(env, task["task_id"]) == "dispatched"


async def test_sweeper(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    handed, _ = await env.router.submit(env.request("set", target="dev-s"))
    assert await env.router.claim("col-a", claim_seq=0, held_task_ids=frozenset(), wait_s=0) is not None
    unclaimed, _ = await env.router.submit(env.request("set", target="dev-u"))
    async with env.router.engine.begin() as conn:
        # dev-u's envelope runs out before anyone claims it ...
        await conn.execute(
            update(dispatches).where(dispatches.c.target_ref == "dev-u").values(expires_at=func.now())
        )
    # ... dev-s's holder stopped claiming a window ago (and Redis has known the fleet for longer).
    await make_silent(env, "col-a")
    counts = await env.router.sweep()
    assert counts["unclaimed"] == 1
    assert counts["unknown"] == 1
    assert await _state(env, handed["task_id"]) == "indeterminate"  # a terminal mutation nobody can confirm
    assert await _state(env, unclaimed["task_id"]) == "queued"  # never handed out: placed again later
    async with env.router.engine.connect() as conn:
        leases = await conn.execute(select(device_leases.c.target_ref, device_leases.c.holder_task_id))
        # The indeterminate task let go of its device; the re-queued one keeps its own.
        assert dict(leases.all()) == {"dev-s": None, "dev-u": unclaimed["task_id"]}


async def test_sweeper_expires_overdue_queued_tasks(env: RouterEnv) -> None:
    # No collector: the task stays queued. Its deadline is then moved into the past in PostgreSQL
    # (the clock the sweeper reads) rather than waited for: a submit slower than a short deadline
    # on a busy machine expires the task at once, which is right, but not what this test is about.
    task, _ = await env.router.submit(env.request("echo"))
    assert task["state"] == "queued"
    assert (await env.router.sweep())["expired"] == 0  # not before its deadline
    async with env.router.engine.begin() as conn:
        await conn.execute(
            update(tasks)
            .where(tasks.c.task_id == task["task_id"])
            .values(deadline=func.now() - dt.timedelta(seconds=1))
        )
    assert (await env.router.sweep())["expired"] == 1
    assert await _state(env, task["task_id"]) == "expired"


@pytest.mark.parametrize(
    ("change", "error", "code"),
    [
        ({"op_class": "write"}, InvalidArgument, "op_class_invalid"),
        ({"provider": ""}, InvalidArgument, "provider_missing"),
        ({"deadline": dt.datetime(2020, 1, 1, tzinfo=dt.UTC)}, InvalidArgument, "deadline_past"),
        ({"params": b"x" * (1024 * 1024 + 1)}, PayloadTooLarge, "params_too_large"),
        ({"idempotency_key": ""}, InvalidArgument, "idempotency_key_missing"),
        ({"labels": {str(i): "v" for i in range(40)}}, InvalidArgument, "labels_invalid"),
    ],
)
async def test_bad_submissions_write_nothing(
    env: RouterEnv, change: dict[str, object], error: type[Exception], code: str
) -> None:
    with pytest.raises(error) as info:
        await env.router.submit(env.request("echo", **change))  # type: ignore[arg-type]
    assert info.value.code == code  # type: ignore[attr-defined]
    async with env.router.engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(tasks))).scalar_one() == 0


async def test_a_lost_reconcile_read_is_dispatched_again(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    task_id, dispatch_id = await _dispatch(env, "apply", "dev-lost")
    await env.router.report("col-a", dispatch_id, S.UNKNOWN)
    lost = await env.router.claim("col-a", claim_seq=10, held_task_ids=frozenset(), wait_s=0)
    assert lost is not None
    # The next numbered claim does not hold it: the reconcile-read is sent again.
    again = await env.router.claim("col-a", claim_seq=11, held_task_ids=frozenset(), wait_s=0)
    assert again is not None and again.dispatch_id != lost.dispatch_id
    assert open_envelope(again.envelope, "col-a")["operation"] == "apply.check"
    assert (await env.router.report("col-a", again.dispatch_id, S.SUCCESS)).state == S.SUCCESS
    assert await _state(env, task_id) == "success"


async def test_tunnel_targets_stay_inside_their_tenant(env: RouterEnv) -> None:
    await env.add_collector("col-a")
    pick = env.router.pick_tunnel_collector
    assert await pick("col-a", env.site_id, env.tenant_id) == "col-a"
    assert await pick("", env.site_id, env.tenant_id) == "col-a"
    with pytest.raises(PermissionDenied) as denied:
        await pick("col-a", "", "another-tenant")
    assert denied.value.code == "collector_not_in_tenant"
    with pytest.raises(PermissionDenied):
        await pick("col-a", "site-elsewhere", env.tenant_id)
    with pytest.raises(NotFound) as unknown:
        await pick("col-nobody", "", "")
    assert unknown.value.code == "collector_not_found"
    # Another tenant's site looks exactly like a site that does not exist.
    for site, tenant in ((env.site_id, "another-tenant"), ("site-none", env.tenant_id)):
        with pytest.raises(NotFound) as missing:
            await pick("", site, tenant)
        assert missing.value.code == "site_not_found"
