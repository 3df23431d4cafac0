"""Concurrent submitters, claimers and two router replicas: one writer per device, one claim per dispatch."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select, text

from common.db.schema import dispatches, tasks
from router.core import store
from router.core.states import State
from router.dispatch import sql_collectors, sql_dispatches
from router.dispatch.service import DeviceLeased, Router
from tests.support.router_env import RouterEnv, make_router, open_envelope

pytestmark = pytest.mark.timeout(120)

DEVICES = [f"sw-{i}" for i in range(5)]
COLLECTORS = [f"col-{i}" for i in range(4)]
SUBMITTERS = 20
TASKS_EACH = 2
MAX_CONCURRENCY = 2


@pytest.fixture
async def routers(database_url: str, redis_url: str) -> AsyncIterator[list[Router]]:
    pair = [make_router(database_url, redis_url), make_router(database_url, redis_url)]
    yield pair
    for router in pair:
        await router.aclose()


class Fleet:
    """Collectors that check, as they claim, that nobody else is writing to the same device."""

    def __init__(self, routers: list[Router]):
        self.routers = routers
        self.writing: dict[str, str] = {}
        self.claimed: list[str] = []
        self.in_flight: Counter[str] = Counter()
        self.violations: list[str] = []
        self.stop = asyncio.Event()

    async def run(self, collector_id: str, index: int) -> None:
        seq = 0
        while not self.stop.is_set():
            router = self.routers[(index + seq) % len(self.routers)]
            seq += 1
            got = await router.claim(collector_id, claim_seq=0, held_task_ids=frozenset(), wait_s=0.2)
            if got is None:
                continue
            envelope = open_envelope(got.envelope, collector_id)
            self.claimed.append(got.dispatch_id)
            self.in_flight[collector_id] += 1
            if self.in_flight[collector_id] > MAX_CONCURRENCY:
                self.violations.append(f"{collector_id} over capacity")
            device = envelope["target_ref"]
            if device in self.writing:
                self.violations.append(f"{device} written by {self.writing[device]} and {got.dispatch_id}")
            self.writing[device] = got.dispatch_id
            await asyncio.sleep(random.uniform(0, 0.02))
            del self.writing[device]
            self.in_flight[collector_id] -= 1
            await router.report(collector_id, got.dispatch_id, State.SUCCESS, b"done")


async def _submitter(env: RouterEnv, router: Router, n: int, done: list[str]) -> None:
    for i in range(TASKS_EACH):
        key = f"sub-{n}-{i}"
        while True:
            try:
                task, _ = await router.submit(env.request("set", target=random.choice(DEVICES), key=key))
                done.append(task["task_id"])
                break
            except DeviceLeased:
                await asyncio.sleep(random.uniform(0.005, 0.03))


async def _run(routers: list[Router], flush_midway: bool = False) -> tuple[Fleet, list[str]]:
    env = RouterEnv(routers[0])
    for cid in COLLECTORS:
        await env.add_collector(cid, max_concurrency=MAX_CONCURRENCY)
    fleet = Fleet(routers)
    workers = [asyncio.create_task(fleet.run(cid, i)) for i, cid in enumerate(COLLECTORS)]
    submitted: list[str] = []
    submitters = [
        asyncio.create_task(_submitter(env, routers[n % len(routers)], n, submitted))
        for n in range(SUBMITTERS)
    ]
    try:
        if flush_midway:
            while len(submitted) < SUBMITTERS * TASKS_EACH // 3:
                await _workers_alive(workers)
                await asyncio.sleep(0.01)
            await routers[0].redis.flushall()
        # A claimer that died holds its devices' leases, and the submitters aimed at them would
        # retry until the test's timeout: fail at once with the claimer's own error instead.
        pending: set[asyncio.Future[None]] = {*submitters, *workers}
        while any(not s.done() for s in submitters):
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending = {t for t in pending if not t.done()}
            await _workers_alive(workers)
        await asyncio.gather(*submitters)
        # Wait for every task to finish, sweeping/re-placing as a replica would.
        for _ in range(400):
            async with routers[0].engine.connect() as conn:
                states = Counter((await conn.execute(select(tasks.c.state))).scalars())
            if states.get("success", 0) == len(submitted):
                break
            await _workers_alive(workers)
            await routers[1].reevaluate()
            await asyncio.sleep(0.05)
        fleet.stop.set()
        await asyncio.gather(*workers)
    finally:
        # Nothing of the run outlives it (the fixture then closes the routers under no load).
        for running in (*workers, *submitters):
            running.cancel()
        await asyncio.gather(*workers, *submitters, return_exceptions=True)
    return fleet, submitted


async def _workers_alive(workers: list[asyncio.Task[None]]) -> None:
    """Raise the error of a claimer that stopped before it was told to."""
    for worker in workers:
        if worker.done():
            await worker


async def _assert_history(router: Router, fleet: Fleet, submitted: list[str]) -> None:
    assert fleet.violations == []
    assert len(fleet.claimed) == len(set(fleet.claimed)), "a dispatch was handed to two claimers"
    async with router.engine.connect() as conn:
        rows = (await conn.execute(select(tasks.c.task_id, tasks.c.state))).all()
        handed = (await conn.execute(select(dispatches.c.dispatch_id, dispatches.c.state))).all()
    assert {r[0] for r in rows} == set(submitted)
    assert Counter(r[1] for r in rows) == {"success": len(submitted)}
    assert sorted(d[0] for d in handed if d[1] == "success") == sorted(fleet.claimed)


async def test_single_writer_and_single_claimer_under_concurrency(routers: list[Router]) -> None:
    fleet, submitted = await _run(routers)
    await _assert_history(routers[0], fleet, submitted)
    assert len(submitted) == SUBMITTERS * TASKS_EACH


async def test_redis_flushall_mid_run_loses_nothing_and_over_dispatches_nothing(
    routers: list[Router],
) -> None:
    fleet, submitted = await _run(routers, flush_midway=True)
    await _assert_history(routers[0], fleet, submitted)
    # Counters were rebuilt from PostgreSQL; after the sweeper's re-sync they agree with it exactly.
    await routers[1].sweep()
    counts = await routers[0].in_flight.get(COLLECTORS)
    assert all(n == 0 for providers in counts.values() for n in providers.values())


async def test_capacity_counts_work_committed_while_placement_waited_for_the_collector_lock(
    routers: list[Router],
) -> None:
    """A placement that waited for a collector's lock counts what the holder committed meanwhile:
    the count is read after the lock is granted, never in the statement that waited for it (whose
    snapshot predates the holder's commit)."""
    router = routers[0]
    env = RouterEnv(router)
    await env.add_collector("col-cap", max_concurrency=1)
    # The first task fills the collector's only slot. Then, holding the collector's lock as a
    # placement would, its dispatch is shown finished and, once a second placement waits for the
    # lock, in flight again: the second placement must count it once the lock is granted.
    first, _ = await router.submit(env.request("echo", key="first"))
    assert first["state"] == State.LEASED.value
    async with router.engine.connect() as conn:
        first_dispatch = await store.get_dispatch(conn, first["current_dispatch_id"])
    assert first_dispatch is not None
    async with router.engine.begin() as holder:
        assert await sql_collectors.lock_collector(holder, "col-cap", skip_locked=False)
        await sql_dispatches.update_dispatch(holder, first_dispatch["dispatch_id"], state=State.SUCCESS.value)
    # Redis (advisory) agrees the slot is free, so placement goes on to the authoritative check.
    await router.in_flight.add("col-cap", "stub", -1)
    async with router.engine.begin() as holder:
        assert await sql_collectors.lock_collector(holder, "col-cap", skip_locked=False)
        second = asyncio.create_task(router.submit(env.request("echo", key="second")))
        await _until_waiting_for_a_lock(router)
        await sql_dispatches.update_dispatch(holder, first_dispatch["dispatch_id"], state=State.LEASED.value)
    task, _ = await second
    assert task["state"] == State.QUEUED.value, "placed beyond the collector's capacity"


async def _until_waiting_for_a_lock(router: Router) -> None:
    for _ in range(500):
        async with router.engine.connect() as conn:
            waiting = (
                await conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                )
            ).scalar_one()
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the placement never waited for the collector lock")
