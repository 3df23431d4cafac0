"""The Tasks pages: every task in every state with filters and export, one task with its attempts,
result and output (live while it runs, a download after), and Cancel / Retry behind a confirmation.

The dispatch queue (console/queue_pages.py) stays what it is: the operator's queue of
indeterminate work. Tasks are what platform modules asked for; dispatches are attempts at them.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from common.errors import VersusError
from common.telemetry.logs import get_logger
from console import security
from console.task_views import (
    SINCE,
    STATE_LABELS,
    FilterInvalid,
    TaskFilters,
    TaskRow,
    export_csv,
    export_json,
)

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

log = get_logger("versus.console")
PAGE_SIZE = 50
# An export walks the filtered list page by page, up to this many rows (narrow the filter for more).
EXPORT_MAX = 5000
MAX_REASON = 500
DONE = {
    "cancelled": "Cancelled.",
    "cancel_asked": "Its collector was asked to stop it; the task ends when the collector answers.",
}
CONSEQUENCE = {
    "cancel": "Work not yet handed to a collector is cancelled at once. Work a collector holds is asked "
    "to stop, and the task ends when the collector answers.",
    "retry": "A new task runs the same operation on the same target with the same parameters. "
    "This task stays as it is.",
}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def tasks(request: Request, session: Session) -> Response:
        q = request.query_params
        wanted = q.get("task", "").strip()[:200]
        if wanted:  # the search box takes a task id
            return RedirectResponse(f"/tasks/{wanted}", status_code=303)
        try:
            filters = TaskFilters.parse(q)
        except FilterInvalid as exc:
            return console.refusal(400, exc.code, str(exc), session, back="/tasks")
        export = q.get("format", "")
        if export:
            return await _export(session, filters, export)
        try:
            listed = await backend.tasks(session.token, filters, q.get("page", "")[:500], PAGE_SIZE, _now())
        except VersusError as exc:
            return console.failed(exc, session, back="/tasks")
        return console.page(
            "tasks.html", session=session, page=listed, f=filters, states=STATE_LABELS, since=list(SINCE),
            live=True,
        )  # fmt: skip

    async def _export(session: Session, filters: TaskFilters, kind: str) -> Response:
        if kind not in ("csv", "json"):
            return console.refusal(400, "format_invalid", "format must be csv or json", session)
        rows: list[TaskRow] = []
        page, now = "", _now()
        try:
            while len(rows) < EXPORT_MAX:
                listed = await backend.tasks(session.token, filters, page, 500, now)
                rows.extend(listed.tasks)
                page = listed.next_page_token
                if not page:
                    break
        except VersusError as exc:
            return console.failed(exc, session, back="/tasks")
        rows = rows[:EXPORT_MAX]
        return console.attachment(export_csv(rows) if kind == "csv" else export_json(rows), kind, "tasks")

    async def task(request: Request, session: Session) -> Response:
        task_id = request.path_params["task_id"]
        try:
            detail = await backend.task(session.token, task_id, _now())
            tail = (
                await backend.output_tail(session.token, task_id, detail.output_length)
                if detail.output_length
                else b""
            )
        except VersusError as exc:
            return console.failed(exc, session, back="/tasks")
        notice = DONE.get(request.query_params.get("done", ""), "")
        retried = request.query_params.get("retried", "")[:200]
        return console.page(
            "task.html", session=session, t=detail, output=tail.decode(errors="replace"),
            truncated=detail.output_length > len(tail), notice=notice, retried=retried, live=True,
        )  # fmt: skip

    async def output(request: Request, session: Session) -> Response:
        task_id = request.path_params["task_id"]
        chunks = backend.output(session.token, task_id)
        try:
            first = await anext(chunks, b"")  # a refusal (not found, not allowed) before any byte is sent
        except VersusError as exc:
            return console.failed(exc, session, back="/tasks")

        async def body() -> AsyncIterator[bytes]:
            if first:
                yield first
            async for chunk in chunks:
                yield chunk

        return StreamingResponse(
            body(), media_type="application/octet-stream",
            headers={"content-disposition": f'attachment; filename="{task_id}.output"'},
        )  # fmt: skip

    async def confirm(request: Request, session: Session) -> Response:
        action, task_id = request.path_params["action"], request.path_params["task_id"]
        if action not in CONSEQUENCE:
            return console.refusal(404, "not_found", "no such action", session)
        try:
            detail = await backend.task(session.token, task_id, _now())
        except VersusError as exc:
            return console.failed(exc, session, back="/tasks")
        return console.page(
            "confirm_task.html", session=session, t=detail, action=action, consequence=CONSEQUENCE[action],
            key=secrets.token_urlsafe(16),
        )  # fmt: skip

    async def act(request: Request) -> Response:
        try:
            session, fields = await console.checked_post(request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        action, task_id = request.path_params["action"], request.path_params["task_id"]
        reason = fields.get("reason", "").strip()[:MAX_REASON]
        try:
            if action == "cancel":
                ended = await backend.cancel_task(session.token, task_id, reason)
                target = f"/tasks/{task_id}?done={'cancelled' if ended else 'cancel_asked'}"
            elif action == "retry":
                key = fields.get("key", "")[:100] or secrets.token_urlsafe(16)
                confirmed = fields.get("terminal_confirmed", "") == "yes"
                new_id = await backend.retry_task(session.token, task_id, key, confirmed, reason)
                target = f"/tasks/{new_id}?retried={task_id}"
            else:
                return console.refusal(404, "not_found", "no such action", session)
        except VersusError as exc:
            return console.failed(exc, session, back="/tasks")
        log.info("console action", operator=session.name, action=f"task_{action}", task_id=task_id)
        return RedirectResponse(target, status_code=303)

    return [
        Route("/tasks", console.signed_in(tasks)),
        Route("/tasks/{task_id}", console.signed_in(task)),
        Route("/tasks/{task_id}/output", console.signed_in(output)),
        Route("/tasks/{task_id}/confirm/{action}", console.signed_in(confirm)),
        Route("/tasks/{task_id}/{action:str}", act, methods=["POST"]),
    ]
