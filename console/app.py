"""The console's pages and actions (Starlette, Jinja2 templates; no JavaScript needed).

Every state-changing request is a POST carrying the session's CSRF token, from the console's
own origin (:mod:`console.security`); every read and action is a gRPC call with the signed-in
operator's token (:mod:`console.backend`), so the services' RBAC decides, never the console.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from common.errors import PermissionDenied, Unauthenticated, VersusError
from common.telemetry.logs import get_logger
from console import (
    audit_pages,
    bulk_pages,
    live,
    overview_pages,
    queue_pages,
    release_pages,
    security,
    site_pages,
    task_pages,
    tools_pages,
    vault_pages,
    views,
)
from console.backend import Backend
from console.live import RECENT_WORK
from console.pages import Console, SecurityHeaders
from console.sessions import ABSOLUTE_S, COOKIE, Session, SessionStore

log = get_logger("versus.console")
HERE = Path(__file__).parent
OPERATOR_ROLES = ("viewer", "operator", "collector-admin")
# What an action's confirmation says will happen (seed 001), before the operator commits to it.
CONSEQUENCE = {
    "approve": "The collector becomes active: work for its site may be routed to it.",
    "deny": "The collector is refused for good; it cannot be approved later and must enroll again.",
    "apply_update": "The collector downloads the latest release for its site's channel, verifies its "
    "signature and restarts into it; a failed start rolls back.",
    "cancel_update": "The update is withdrawn: a collector that has not started it stays on its version.",
    "drain": "No new work will be routed to this collector. Work already running finishes.",
    "undrain": "The collector will take new work again.",
    "revoke": "Its certificate will no longer be accepted and every live session is closed at once. "
    "There is no undo: the only way back is enrolling again with a new token.",
}
DONE = {
    "approve": "Approved: the collector is active.",
    "deny": "Denied: the collector is refused for good.",
    "apply_update": "Update applied: the collector installs it at its next claim.",
    "cancel_update": "Update cancelled.",
    "vault": "Vault mode changed: the collector restarts into it with its next signed config.",
    "drain": "Drained: no new work is routed to this collector; running work finishes.",
    "undrain": "Undrained: the collector takes new work again.",
    "revoke": "Revoked: its certificate is refused and its sessions were closed.",
}


def create_app(
    backend: Backend,
    sessions: SessionStore,
    origins: tuple[str, ...],
    stopping: Callable[[], bool] = lambda: False,
) -> ASGIApp:
    """The console's ASGI app; ``stopping`` says the server is shutting down (live streams end)."""
    console = Console(backend, sessions, origins)

    async def signin_page(request: Request) -> Response:
        if await console.session(request) is not None:
            return RedirectResponse("/", status_code=303)
        return console.page("signin.html", session=None, error="")

    async def signin(request: Request) -> Response:
        try:
            _check_origin(origins, request)
            token = security.form(await request.body()).get("token", "").strip()
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        if not token:
            return console.page("signin.html", 400, session=None, error="Enter an API token.")
        try:
            who = await backend.whoami(token)
        except (Unauthenticated, PermissionDenied):
            log.info("console sign-in refused")
            return console.page("signin.html", 401, session=None, error="That API token is not valid.")
        except VersusError as exc:
            return console.page("signin.html", 503, session=None, error=exc.message)
        if who.role not in OPERATOR_ROLES:
            return console.page(
                "signin.html", 403, session=None,
                error=f"A {who.role} token cannot sign in to the console: use an operator's token.",
            )  # fmt: skip
        cookie, _ = await sessions.create(token, who.name, who.role, who.tenants)
        log.info("console sign-in", operator=who.name, role=who.role)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE, cookie, max_age=ABSOLUTE_S, path="/", secure=True, httponly=True, samesite="strict"
        )
        return response

    async def signout(request: Request) -> Response:
        try:
            await console.checked_post(request)
        except security.Refused as exc:
            if exc.code != "session_missing":
                return console.refusal(exc.status, exc.code, str(exc))
        await sessions.end(request.cookies.get(COOKIE))
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return response

    async def collectors(request: Request, session: Session) -> Response:
        filters = views.CollectorFilters.parse(request.query_params)
        page = request.query_params.get("page", "")[:500]
        try:
            listed = await backend.collectors(session.token, filters, page)
            names = await backend.site_names(session.token, need=[c.site_id for c in listed.collectors])
        except VersusError as exc:
            return console.failed(exc, session)
        return console.page(
            "collectors.html", session=session, page=listed, f=filters, live=True, names=names,
            statuses=views.STATUS.values(), sessions=views.SESSION.values(),
        )  # fmt: skip

    async def collector(request: Request, session: Session) -> Response:
        return await _detail(
            session, request.path_params["collector_id"], DONE.get(request.query_params.get("done", ""), "")
        )

    async def _detail(
        session: Session, collector_id: str, notice: str, status: int = 200, problem: str = ""
    ) -> Response:
        try:
            view = await backend.collector(session.token, collector_id)
            work = await backend.dispatches(session.token, "all", "", collector_id, "", page_size=RECENT_WORK)
            names = await backend.site_names(session.token, need=[view.site_id])
            vaults = (
                await backend.vault_integrations(session.token) if views.may(session.role, "vault") else []
            )
        except VersusError as exc:
            return console.failed(exc, session)
        return console.page(
            "collector.html", status, session=session, c=view, notice=notice, problem=problem, live=True,
            work=work.dispatches, site_name=names.get(view.site_id, ""), integrations=vaults,
        )  # fmt: skip

    async def confirm(request: Request, session: Session) -> Response:
        action = request.path_params["action"]
        if action not in CONSEQUENCE:
            return console.refusal(404, "not_found", "no such action", session)
        return console.page(
            "confirm.html", session=session, collector_id=request.path_params["collector_id"], action=action,
            consequence=CONSEQUENCE[action], label=action.replace("_", " ").capitalize(),
        )  # fmt: skip

    async def act(request: Request) -> Response:
        action, collector_id = request.path_params["action"], request.path_params["collector_id"]
        if action not in views.ACTION_RPC:
            return PlainTextResponse("not found", status_code=404)
        try:
            session, fields = await console.checked_post(request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        try:
            if action == "vault":
                await backend.set_vault(
                    session.token, collector_id, fields.get("mode", ""),
                    fields.get("integration_id", "")[:200], fields.get("secret_id", "")[:4096],
                )  # fmt: skip
                said, good = "", True
            else:
                reason = fields.get("reason", "")[:500]
                said, good = await backend.act(session.token, action, collector_id, reason)
        except VersusError as exc:
            return console.failed(exc, session)
        log.info("console action", operator=session.name, action=action, collector_id=collector_id)
        if action == "probe":
            if good:
                return await _detail(session, collector_id, said)
            return await _detail(session, collector_id, "", problem=said)
        return RedirectResponse(f"/collectors/{collector_id}?done={action}", status_code=303)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def favicon(request: Request) -> Response:
        # Browsers ask for /favicon.ico whatever the page links: the same icon, as SVG.
        return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")

    routes = [
        *overview_pages.routes(console),
        *bulk_pages.routes(console),
        *vault_pages.routes(console),
        *tools_pages.routes(console),
        Route("/signin", signin_page, methods=["GET"]),
        Route("/signin", signin, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/collectors", console.signed_in(collectors)),
        Route("/collectors/{collector_id}", console.signed_in(collector)),
        Route("/collectors/{collector_id}/confirm/{action}", console.signed_in(confirm)),
        Route("/collectors/{collector_id}/{action}", act, methods=["POST"]),
        *queue_pages.routes(console),
        *task_pages.routes(console),
        *site_pages.routes(console),
        *release_pages.routes(console),
        *audit_pages.routes(console),
        *live.routes(console, stopping),
        Route("/healthz", healthz),
        Route("/favicon.ico", favicon),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return SecurityHeaders(Starlette(routes=routes))


def _check_origin(origins: tuple[str, ...], request: Request) -> None:
    security.same_origin(origins, request.headers.get("origin"), request.headers.get("sec-fetch-site"))
