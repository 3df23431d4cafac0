"""An open control socket costs no task of its own (gateway/control_socket.py): only a frame being
answered has one, a parked claim included, and the revocation broadcast still reaches an idle
socket. Real gateway, router, PostgreSQL and Redis on real sockets, in this test's event loop, so
the gateway's tasks can be counted (tests/integration/test_gateway_collector.py ``running_stack``).
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets
from sqlalchemy import update

from common.db.schema import collectors
from common.redis import revocations
from gateway.edge import EdgeHttpProtocol
from tests.integration import test_gateway_collector as gw
from tests.integration.test_gateway_collector import Stack, running_stack

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

# Code that serves one socket: the gateway's control modules, and the ASGI server and framework (a
# task per socket there is what this test rules out). The process's own tasks (the router link's
# streams, the parking hub) are not per socket.
_SERVING = ("/gateway/control", "/uvicorn/", "/starlette/", "/fastapi/")


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        yield running


def _serving_tasks() -> list[str]:
    """What the tasks running the gateway's (and the ASGI server's) code are doing, by coroutine."""
    found = []
    for task in asyncio.all_tasks():
        coro: Any = task.get_coro()
        code = getattr(coro, "cr_code", None)
        if code is not None and any(part in code.co_filename for part in _SERVING):
            found.append(code.co_qualname)
    return sorted(found)


async def _settled(before: list[str], expected: list[str]) -> list[str]:
    """The serving tasks beyond ``before`` once they are ``expected`` (10 s at most: a busy machine)."""
    extra: list[str] = []
    for _ in range(200):
        now = _serving_tasks()
        extra = sorted({name for name in now if now.count(name) > before.count(name)})
        if extra == sorted(expected):
            return extra
        await asyncio.sleep(0.05)
    return extra


async def test_an_idle_socket_has_no_task_and_a_parked_claim_has_one(stack: Stack) -> None:
    c = await stack.enroll("col-footprint")
    assert (await stack.publish(c)).status_code == 200  # it can run the work submitted below
    before = _serving_tasks()
    http_protocols = _alive(EdgeHttpProtocol)
    async with await gw._ws(stack, c) as ws:
        # Open and idle: nothing runs for it, and the HTTP protocol that read its upgrade is gone.
        assert await _settled(before, []) == []
        assert _alive(EdgeHttpProtocol) == http_protocols
        # A claim waiting for work: its one task, answering that frame.
        await ws.send(json.dumps({"v": 1, "id": "c1", "type": "claim", "body": {"wait_s": 20}}))
        assert await _settled(before, ["ControlSession._answer"]) == ["ControlSession._answer"]
        # Answered (work arrived): nothing again, the socket still open.
        await stack.submit("footprint-1")
        answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (answer["id"], answer["status"]) == ("c1", 200)
        assert await _settled(before, []) == []
        # The revocation broadcast reaches the idle socket with no task waiting for it.
        await _revoke(stack, c.collector_id)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4401, "collector_revoked")
    assert await _settled(before, []) == []


def _alive(kind: type) -> int:
    gc.collect()  # what only a reference cycle keeps is not the socket's cost
    return sum(1 for o in gc.get_objects() if isinstance(o, kind))


async def _revoke(stack: Stack, collector_id: str) -> None:
    async with stack.service.store.engine.begin() as conn:
        await conn.execute(
            update(collectors).where(collectors.c.collector_id == collector_id).values(status="revoked")
        )
    await revocations.announce(stack.redis, collector_id)
