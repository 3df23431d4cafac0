"""The audit log page: every audited action newest first, filtered by subject, actor, action and a
range of days, subjects linked to their pages, and the filtered log exported as CSV or JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from common.errors import VersusError
from console.audit_views import AuditFilters, export_csv, export_json, subject_href
from console.task_views import FilterInvalid
from console.views import AuditEntry

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

EXPORT_MAX = 5000


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def audit(request: Request, session: Session) -> Response:
        q = request.query_params
        try:
            f = AuditFilters.parse(q)
        except FilterInvalid as exc:
            return console.refusal(400, exc.code, str(exc), session, back="/audit")
        kind = q.get("format", "")
        try:
            if kind:
                return await _export(session, f, kind)
            listed = await backend.audit(session.token, f, q.get("page", "")[:500])
        except VersusError as exc:
            return console.failed(exc, session, back="/audit")
        return console.page("audit.html", session=session, page=listed, f=f, href=subject_href)

    async def _export(session: Session, f: AuditFilters, kind: str) -> Response:
        if kind not in ("csv", "json"):
            return console.refusal(
                400, "format_invalid", "format must be csv or json", session, back="/audit"
            )
        entries: list[AuditEntry] = []
        page = ""
        while len(entries) < EXPORT_MAX:
            listed = await backend.audit(session.token, f, page, page_size=500)
            entries += listed.events
            page = listed.next_page_token
            if not page:
                break
        entries = entries[:EXPORT_MAX]
        body = export_csv(entries) if kind == "csv" else export_json(entries)
        return console.attachment(body, kind, "audit")

    return [Route("/audit", console.signed_in(audit))]
