"""A signed report of a task's outcome is answered in one statement (router/dispatch/sql_tasks.py
``answer_at_once``) that writes exactly what the general path writes, and any report that is not
that simple case takes the general path with nothing written by the attempt. Real PostgreSQL and
Redis (tests/support/router_env.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import select

from common.db.schema import audit_events, device_leases, dispatches, tasks
from common.errors import PermissionDenied
from common.trust import report_signature
from common.trust.report_signature import ReportSignatureError, ReportStatement
from router.core.states import State, check_transition
from router.dispatch import sql_tasks
from tests.support.collector_key import KEY
from tests.support.router_env import RouterEnv

pytestmark = pytest.mark.timeout(60)
S = State


def test_the_statement_moves_only_along_the_state_machine() -> None:
    for current in sql_tasks.ANSWER_AT_ONCE_FROM:
        for outcome in sql_tasks.ANSWER_AT_ONCE_OUTCOMES:
            check_transition(current, outcome)


def _signed(collector: str, dispatch_id: str, outcome: str, result: bytes, code: str, message: str) -> str:
    statement = ReportStatement(collector, dispatch_id, outcome, result, code, message)
    return report_signature.sign(KEY, statement, int(time.time()))


class AtOnce:
    """Counts the reports answered by the one statement (a row back) and those it passed on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answered = 0
        self.passed = 0
        original = sql_tasks.answer_at_once

        async def counted(*args: Any, **kw: Any) -> Any:
            row = await original(*args, **kw)
            if row is None:
                self.passed += 1
            else:
                self.answered += 1
            return row

        monkeypatch.setattr(sql_tasks, "answer_at_once", counted)


async def _report(
    env: RouterEnv,
    collector: str,
    dispatch_id: str,
    outcome: State,
    result: bytes,
    code: str = "",
    message: str = "",
) -> Any:
    signature = _signed(collector, dispatch_id, outcome.value, result, code, message)
    return await env.router.report(
        collector, dispatch_id, outcome, result, code, message, signature=signature
    )


async def _claimed(env: RouterEnv, operation: str, target: str) -> tuple[str, str, str]:
    """(collector, task, dispatch) of a task submitted and claimed by the collector it was placed on."""
    task, _ = await env.router.submit(env.request(operation, target=target))
    async with env.router.engine.connect() as conn:
        collector = (
            await conn.execute(
                select(dispatches.c.collector_id).where(
                    dispatches.c.dispatch_id == task["current_dispatch_id"]
                )
            )
        ).scalar_one()
    got = await env.router.claim(collector, claim_seq=0, held_task_ids=frozenset(), wait_s=0)
    assert got is not None and got.dispatch_id == task["current_dispatch_id"]
    return collector, str(task["task_id"]), got.dispatch_id


async def _keys_kept(env: RouterEnv, collectors: set[str]) -> None:
    """Each of ``collectors`` has reported once, so its key is kept (placement picks who runs what)."""
    for n in range(40):
        if collectors <= set(env.router._report_keys):
            return
        collector, _, dispatch_id = await _claimed(env, "echo", f"dev-warm-{n}")
        await _report(env, collector, dispatch_id, S.SUCCESS, b"ok")
    raise AssertionError(f"placement never reached {collectors - set(env.router._report_keys)}")


async def _written(env: RouterEnv, task_id: str, dispatch_id: str, target: str) -> dict[str, Any]:
    """What a report left behind, without ids and times."""
    async with env.router.engine.connect() as conn:
        task = (await conn.execute(select(tasks).where(tasks.c.task_id == task_id))).mappings().one()
        d = (
            (await conn.execute(select(dispatches).where(dispatches.c.dispatch_id == dispatch_id)))
            .mappings()
            .one()
        )
        lease = (
            (await conn.execute(select(device_leases).where(device_leases.c.target_ref == target)))
            .mappings()
            .one_or_none()
        )
    return {
        "task": (
            task["state"], task["result"], task["error_code"], task["current_dispatch_id"] == dispatch_id,
        ),
        "dispatch": (
            d["state"], d["result"], d["error_code"], d["error_message"],
            d["reported_at"] is not None, d["report_signature"] is not None,
        ),
        "lease": None if lease is None else (
            lease["holder_task_id"], lease["holder_dispatch_id"], lease["collector_id"], lease["expires_at"],
            lease["fenced_until"] is not None,
        ),
        "history": (await env.history(task_id))[-1],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("outcome", "result", "code", "message"),
    [(S.SUCCESS, b"done", "", ""), (S.FAILED, b"", "device_refused", "the device said no")],
)
async def test_one_statement_writes_what_the_general_path_writes(
    env: RouterEnv, monkeypatch: pytest.MonkeyPatch, outcome: State, result: bytes, code: str, message: str
) -> None:
    at_once = AtOnce(monkeypatch)
    await env.add_collector("col-a")
    # A mutation: its device lease is released (and fenced) by the report.
    _, first_task, first = await _claimed(env, "set", "dev-1")
    _, second_task, second = await _claimed(env, "set", "dev-2")
    # The first report of a collector reads its key from PostgreSQL: the general path.
    assert (await _report(env, "col-a", first, outcome, result, code, message)).state == outcome
    assert (at_once.answered, at_once.passed) == (0, 0)
    # From then on its kept key verifies the report: one statement.
    assert (await _report(env, "col-a", second, outcome, result, code, message)).state == outcome
    assert (at_once.answered, at_once.passed) == (1, 0)
    general = await _written(env, first_task, first, "dev-1")
    assert general == await _written(env, second_task, second, "dev-2")
    assert general["task"][0] == outcome.value and general["lease"] is not None
    assert general["lease"][0] is None  # released


async def test_anything_else_takes_the_general_path_with_nothing_written(
    env: RouterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_once = AtOnce(monkeypatch)
    await env.add_collector("col-a")
    await env.add_collector("col-b")
    await _keys_kept(env, {"col-a", "col-b"})
    answered = at_once.answered
    owner, task_id, dispatch_id = await _claimed(env, "echo", "dev-3")
    other = "col-b" if owner == "col-a" else "col-a"
    before = await _written(env, task_id, dispatch_id, "dev-3")
    # Another collector speaks about this dispatch: refused, audited, nothing changed.
    with pytest.raises(PermissionDenied):
        await _report(env, other, dispatch_id, S.SUCCESS, b"ok")
    assert (at_once.answered, at_once.passed) == (answered, 1)
    assert await _written(env, task_id, dispatch_id, "dev-3") == before
    assert "report.foreign_dispatch" in await _audited(env, task_id)
    # A signature over something else (the kept key refuses it): the general path refuses and
    # audits it, and nothing is written.
    forged = _signed(owner, dispatch_id, "success", b"other", "", "")
    with pytest.raises(ReportSignatureError):
        await env.router.report(owner, dispatch_id, S.SUCCESS, b"ok", signature=forged)
    assert await _written(env, task_id, dispatch_id, "dev-3") == before
    assert "report.bad_signature" in await _audited(env, task_id)
    # Its own report: one statement; the same again is a duplicate, answered by the general path.
    assert not (await _report(env, owner, dispatch_id, S.SUCCESS, b"ok")).duplicate
    assert (await _report(env, owner, dispatch_id, S.SUCCESS, b"ok")).duplicate
    assert (at_once.answered, at_once.passed) == (answered + 1, 2)


async def test_a_freed_slot_is_filled_only_when_work_waits_for_it(
    env: RouterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    await env.add_collector("col-one", max_concurrency=1)
    await _keys_kept(env, {"col-one"})
    fills: list[str] = []
    fill_slot = env.router.fill_slot

    async def counted(*args: Any, **kw: Any) -> bool:
        fills.append(args[0])
        return await fill_slot(*args, **kw)

    monkeypatch.setattr(env.router, "fill_slot", counted)
    # Nothing queued behind: no fill is tried.
    _, _, alone = await _claimed(env, "echo", "dev-4")
    await _report(env, "col-one", alone, S.SUCCESS, b"ok")
    # (A fill started by it would have started before the one below ends: counted at the end.)
    # A task queued behind the one running: the freed slot takes it.
    _, _, running = await _claimed(env, "echo", "dev-5")
    waiting, _ = await env.router.submit(env.request("echo", target="dev-6"))
    assert waiting["state"] == "queued"
    await _report(env, "col-one", running, S.SUCCESS, b"ok")
    for _ in range(50):
        task, _ = await env.router.get(waiting["task_id"])
        if task["state"] == "leased":
            break
        await asyncio.sleep(0.05)
    assert task["state"] == "leased" and len(fills) == 1


async def _audited(env: RouterEnv, subject: str) -> list[str]:
    async with env.router.engine.connect() as conn:
        rows = await conn.execute(select(audit_events.c.action).where(audit_events.c.subject_id == subject))
        return list(rows.scalars())
