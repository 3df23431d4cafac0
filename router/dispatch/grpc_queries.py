"""The TaskRouterService RPCs operators browse with: the task list, the dispatch queue and one
dispatch. Reads only; the tenant scope of the caller's token narrows the task list."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy.engine import RowMapping
from versus.router.v1 import task_router_pb2 as pb

from common.access import rbac
from common.errors import InvalidArgument, NotFound
from common.grpc.server import Context
from router.dispatch import sql_dispatches, sql_task_list
from router.dispatch.pb_convert import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    decode_page_token,
    dispatch_pb,
    encode_page_token,
    states_from_pb,
    task_pb,
)
from router.dispatch.service import Router


def _page_size(requested: int) -> int:
    size = requested or DEFAULT_PAGE_SIZE
    if size > MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size must be at most {MAX_PAGE_SIZE}", code="page_size_too_large")
    return size


class QueryRpcs:
    """Mixed into the TaskRouterService servicer, which supplies ``router``."""

    router: Router

    async def ListTasks(self, request: pb.ListTasksRequest, context: Context) -> pb.ListTasksResponse:
        size = _page_size(request.page_size)
        after_at = request.created_after.ToDatetime(dt.UTC) if request.HasField("created_after") else None
        before = request.created_before.ToDatetime(dt.UTC) if request.HasField("created_before") else None
        if after_at is not None and before is not None and before <= after_at:
            raise InvalidArgument(
                "created_before must be later than created_after", code="time_range_invalid"
            )
        where = sql_task_list.TaskFilter(
            states=states_from_pb(request.states),
            site_id=request.site_id,
            tenant_id=request.tenant_id,
            provider=request.provider,
            operation=request.operation,
            target_ref=request.target_ref,
            labels=dict(request.labels),
            created_after=after_at,
            created_before=before,
            tenants=rbac.tenant_filter(),
        )
        async with self.router.engine.connect() as conn:
            rows = await sql_task_list.list_tasks(
                conn, where, decode_page_token(request.page_token), size + 1
            )
        page = rows[:size]
        token = encode_page_token(page[-1]["created_at"], page[-1]["task_id"]) if len(rows) > size else ""
        return pb.ListTasksResponse(tasks=[task_pb(t) for t in page], next_page_token=token)

    async def ListDispatches(
        self, request: pb.ListDispatchesRequest, context: Context
    ) -> pb.ListDispatchesResponse:
        size = _page_size(request.page_size)
        states, task_states = states_from_pb(request.states), states_from_pb(request.task_states)
        async with self.router.engine.connect() as conn:
            rows = await sql_dispatches.list_dispatches(
                conn,
                states=states,
                task_states=task_states,
                site_id=request.site_id,
                collector_id=request.collector_id,
                target_ref=request.target_ref,
                task_id=request.task_id,
                after=decode_page_token(request.page_token),
                limit=size + 1,
            )
        page = rows[:size]
        token = encode_page_token(page[-1]["created_at"], page[-1]["dispatch_id"]) if len(rows) > size else ""
        return pb.ListDispatchesResponse(dispatches=[dispatch_pb(d) for d in page], next_page_token=token)

    async def GetDispatch(self, request: pb.GetDispatchRequest, context: Context) -> pb.GetDispatchResponse:
        found: Sequence[RowMapping] = ()
        if request.dispatch_id:
            async with self.router.engine.connect() as conn:
                found = await sql_dispatches.list_dispatches(
                    conn, states=(), task_states=(), site_id="", collector_id="", target_ref="", after=None,
                    limit=1, dispatch_id=request.dispatch_id,
                )  # fmt: skip
        if not found:
            raise NotFound(f"dispatch {request.dispatch_id!r} does not exist", code="dispatch_not_found")
        task, history = await self.router.get(found[0]["task_id"])
        return pb.GetDispatchResponse(dispatch=dispatch_pb(found[0]), task=task_pb(task, history))
