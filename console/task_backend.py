"""The console's calls about tasks (TaskRouterService), as the signed-in operator: the list, one task
with its attempts, its output, cancel and retry. Mixed into :class:`console.backend.Backend`."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from versus.router.v1 import task_router_pb2 as pb

from common import error_mapping
from common.errors import Unavailable, VersusError
from common.grpc.headers import AUTHORIZATION_HEADER
from console.queue_views import dispatch_view
from console.task_views import STATE_GROUPS, TaskDetail, TaskFilters, TaskPage, task_detail, task_row

T = TypeVar("T")
# A task's attempts shown on its page: the ladder is short (execute, then reconcile-reads).
MAX_ATTEMPTS_SHOWN = 50
# Output shown on a task's page: its last bytes (the whole output is a download).
OUTPUT_TAIL = 64 * 1024
OUTPUT_TIMEOUT_S = 600.0


def rpc_error(exc: grpc.aio.AioRpcError, address: str) -> VersusError:
    """A failed call as the service's domain error (common/error_mapping.py); no answer at all is
    ``backend_unavailable``."""
    unreachable = Unavailable(f"the control plane at {address} did not answer", code="backend_unavailable")
    return error_mapping.from_rpc_error(exc, unreachable)


class TaskCalls:
    """Needs ``_call`` and ``_tasks`` from the backend it is mixed into."""

    _tasks: Any
    _call: Callable[..., Awaitable[Any]]
    router_address: str

    async def tasks(
        self, token: str, filters: TaskFilters, page_token: str, page_size: int, now: dt.datetime
    ) -> TaskPage:
        after, before = filters.window(now)
        request = pb.ListTasksRequest(
            states=STATE_GROUPS[filters.state], site_id=filters.site, tenant_id=filters.tenant,
            provider=filters.provider, operation=filters.operation, target_ref=filters.target,
            labels=filters.labels, page_size=page_size, page_token=page_token,
        )  # fmt: skip
        if after is not None:
            request.created_after.FromDatetime(after)
        if before is not None:
            request.created_before.FromDatetime(before)
        reply = await self._call(self._tasks.ListTasks, request, token)
        return TaskPage([task_row(t, now) for t in reply.tasks], reply.next_page_token)

    async def task(self, token: str, task_id: str, now: dt.datetime) -> TaskDetail:
        got = await self._call(self._tasks.GetTask, pb.GetTaskRequest(task_id=task_id), token)
        listed = await self._call(
            self._tasks.ListDispatches,
            pb.ListDispatchesRequest(task_id=task_id, page_size=MAX_ATTEMPTS_SHOWN),
            token,
        )
        return task_detail(got.task, [dispatch_view(d) for d in listed.dispatches], now)

    async def output_tail(self, token: str, task_id: str, length: int) -> bytes:
        """The last :data:`OUTPUT_TAIL` bytes of the task's output stored so far."""
        start = max(0, length - OUTPUT_TAIL)
        return b"".join([chunk async for chunk in self.output(token, task_id, start, timeout_s=10.0)])

    async def output(
        self, token: str, task_id: str, offset: int = 0, timeout_s: float = OUTPUT_TIMEOUT_S
    ) -> AsyncIterator[bytes]:
        """The task's stored output from ``offset``, chunk by chunk (a download streams it on)."""
        call = self._tasks.ReadOutput(
            pb.ReadOutputRequest(task_id=task_id, offset=offset), timeout=timeout_s,
            metadata=((AUTHORIZATION_HEADER, f"Bearer {token}"),),
        )  # fmt: skip
        try:
            async for chunk in call:
                if chunk.data:
                    yield bytes(chunk.data)
        except grpc.aio.AioRpcError as exc:
            raise rpc_error(exc, self.router_address) from None

    async def cancel_task(self, token: str, task_id: str, reason: str) -> str:
        """Cancel; the task's state after (a held task stays until its collector answers)."""
        reply = await self._call(
            self._tasks.CancelTask, pb.CancelTaskRequest(task_id=task_id, reason=reason), token
        )
        return str(reply.task.task_id)

    async def retry_task(
        self, token: str, task_id: str, key: str, terminal_confirmed: bool, reason: str
    ) -> str:
        """Run a settled task again; the new task's id."""
        request = pb.RetryTaskRequest(
            task_id=task_id, idempotency_key=key, terminal_confirmed=terminal_confirmed, reason=reason
        )
        reply = await self._call(self._tasks.RetryTask, request, token)
        return str(reply.task.task_id)
