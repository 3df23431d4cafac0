"""Bulk actions: drain, undrain, apply an update to or revoke a selection of collectors, or every
collector of a site, behind one confirmation that names the count and the consequence.

Each collector is one call to the same RPC a single action makes, as the signed-in operator, so
each is authorised, and audited one event per collector, exactly as if done one by one; a refusal
for one (say, already revoked) is reported beside its id and does not stop the others.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from common.errors import VersusError
from common.telemetry.logs import get_logger
from console import security
from console.views import CollectorFilters, may

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

log = get_logger("versus.console")
# The most collectors one bulk action takes (a site with more is done in turns, by filter).
MAX_BULK = 500
# Calls in flight at once: a bulk action must not crowd out every other operator's.
CONCURRENCY = 8
ACTIONS = {
    "drain": ("Drain", "No new work will be routed to {n}. Work already running finishes."),
    "undrain": ("Undrain", "{n} will take new work again."),
    "apply_update": (
        "Apply the update to",
        "{n} download the latest release for their site's channel, verify its signature and restart "
        "into it; a failed start rolls back.",
    ),
    "revoke": (
        "Revoke",
        "The certificates of {n} will no longer be accepted and every live session is closed at once. "
        "There is no undo: the only way back is enrolling each again with a new token.",
    ),
}
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def _count(n: int) -> str:
    return f"{n} collector{'s' if n != 1 else ''}"


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def _site_collectors(token: str, site_id: str) -> list[str]:
        found: list[str] = []
        page = ""
        while len(found) <= MAX_BULK:
            listed = await backend.collectors(token, CollectorFilters(site=site_id), page)
            found += [c.collector_id for c in listed.collectors if c.status not in ("revoked", "denied")]
            page = listed.next_page_token
            if not page:
                break
        return found

    async def confirm(request: Request, session: Session) -> Response:
        q = request.query_params
        action, site = q.get("action", ""), q.get("site", "")[:200]
        if action not in ACTIONS or not may(session.role, action):
            return console.refusal(400, "action_invalid", f"choose one of {', '.join(ACTIONS)}", session)
        try:
            ids = await _site_collectors(session.token, site) if site else q.getlist("id")
        except VersusError as exc:
            return console.failed(exc, session)
        ids = list(dict.fromkeys(i for i in ids if _ID.match(i)))
        if not ids:
            return console.refusal(400, "selection_empty", "select at least one collector", session)
        if len(ids) > MAX_BULK:
            said = f"at most {MAX_BULK} collectors at once: narrow the selection"
            return console.refusal(400, "selection_too_large", said, session)
        label, consequence = ACTIONS[action]
        return console.page(
            "confirm_bulk.html", session=session, action=action, ids=ids, site=site,
            title=f"{label} {_count(len(ids))}{' of this site' if site else ''}?",
            consequence=consequence.format(n=f"these {_count(len(ids))}"),
        )  # fmt: skip

    async def act(request: Request) -> Response:
        try:
            session, fields = await console.checked_post(request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        action = request.path_params["action"]
        if action not in ACTIONS:
            return console.refusal(404, "not_found", "no such action", session)
        ids = [i for i in fields.get("ids", "").split(",") if _ID.match(i)][: MAX_BULK + 1]
        if not ids or len(ids) > MAX_BULK:
            return console.refusal(400, "selection_invalid", f"1 to {MAX_BULK} collectors", session)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(collector_id: str) -> tuple[str, str]:
            async with gate:
                try:
                    await backend.act(session.token, action, collector_id, fields.get("reason", "")[:500])
                except VersusError as exc:
                    return collector_id, exc.code
                return collector_id, ""

        results = await asyncio.gather(*(one(i) for i in ids))
        failed = [(i, code) for i, code in results if code]
        log.info("console bulk action", operator=session.name, action=action, collectors=len(ids),
                 failed=len(failed))  # fmt: skip
        return console.page(
            "bulk_done.html", session=session, label=ACTIONS[action][0], done=len(ids) - len(failed),
            total=len(ids), failed=failed, site=fields.get("site", ""),
        )  # fmt: skip

    return [
        Route("/bulk/confirm", console.signed_in(confirm)),
        Route("/bulk/{action}", act, methods=["POST"]),
    ]
