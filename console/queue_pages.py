"""The dispatch queue's pages: dispatches filtered by outcome, one dispatch with its task's
history and evidence, and resolving an indeterminate task with a note (seed 001)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from common.errors import VersusError
from common.telemetry.logs import get_logger
from console import security
from console.queue_views import OUTCOMES, RESOLUTIONS

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

log = get_logger("versus.console")
MAX_NOTE = 1000


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def queue(request: Request, session: Session) -> Response:
        q = request.query_params
        outcome = q.get("outcome", "all")
        if outcome not in OUTCOMES:
            return console.refusal(
                400, "outcome_invalid", f"outcome must be one of {', '.join(OUTCOMES)}", session
            )
        site, collector, page = q.get("site", "")[:200], q.get("collector", "")[:200], q.get("page", "")[:500]
        try:
            listed = await backend.dispatches(session.token, outcome, site, collector, page)
        except VersusError as exc:
            return console.failed(exc, session, back="/queue")
        return console.page(
            "queue.html", session=session, page=listed, outcome=outcome, outcomes=list(OUTCOMES), site=site,
            collector=collector, live=True,
        )  # fmt: skip

    async def dispatch(request: Request, session: Session) -> Response:
        try:
            d, task = await backend.dispatch(session.token, request.path_params["dispatch_id"])
        except VersusError as exc:
            return console.failed(exc, session, back="/queue")
        resolved = request.query_params.get("resolved", "") in RESOLUTIONS
        return console.page("dispatch.html", session=session, d=d, task=task, resolved=resolved)

    async def resolve(request: Request) -> Response:
        try:
            session, fields = await console.checked_post(request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        resolution, back = fields.get("resolution", ""), fields.get("dispatch_id", "")
        if resolution not in RESOLUTIONS:
            return console.refusal(400, "resolution_invalid", "choose success or failed", session)
        note = fields.get("note", "").strip()[:MAX_NOTE]
        task_id = request.path_params["task_id"]
        try:
            await backend.resolve(session.token, task_id, resolution, note)
        except VersusError as exc:
            return console.failed(exc, session)
        log.info(
            "console action", operator=session.name, action="resolve", task_id=task_id, resolution=resolution
        )
        target = f"/queue/{back}?resolved={resolution}" if back else "/queue?outcome=indeterminate"
        return RedirectResponse(target, status_code=303)

    return [
        Route("/queue", console.signed_in(queue)),
        Route("/queue/{dispatch_id}", console.signed_in(dispatch)),
        Route("/tasks/{task_id}/resolve", resolve, methods=["POST"]),
    ]
