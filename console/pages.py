"""What every page handler of the console shares: templates, refusals, the signed-in check and
the CSRF-checked POST (:class:`Console`), and the security headers on every response.

Apart from console/app.py, which puts the pages together, so each page module
(console/*_pages.py, console/live.py) builds on this one without importing the app."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.error_mapping import status_for
from common.errors import VersusError
from console import security, views
from console.backend import Backend
from console.sessions import COOKIE, Session, SessionStore

HERE = Path(__file__).parent
# The lists an error page leads back to: the one the refused page belongs to.
BACK = {
    "/collectors": "Back to the collectors",
    "/queue": "Back to the dispatch queue",
    "/tasks": "Back to the tasks",
    "/sites": "Back to the sites",
    "/releases": "Back to the releases",
    "/audit": "Back to the audit log",
}


class SecurityHeaders:
    """Adds the console's security headers to every response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *security.HEADERS]
            await send(message)

        await self.app(scope, receive, sending)


class Console:
    """The app's state: the backend, the session store and the templates."""

    def __init__(self, backend: Backend, sessions: SessionStore, origins: tuple[str, ...]):
        self.backend = backend
        self.sessions = sessions
        self.origins = origins  # "https://host:port" as browsers send it in Origin
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"])
        )

    def page(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = self.templates.get_template(name).render(may=views.may, **values)
        return HTMLResponse(html, status_code=status)

    def attachment(self, body: str, kind: str, stem: str) -> Response:
        """An export the browser saves: ``kind`` is csv or json, named ``<stem>-<UTC time>.<kind>``."""
        media = "text/csv; charset=utf-8" if kind == "csv" else "application/json"
        name = f"{stem}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.{kind}"
        return Response(
            body, media_type=media, headers={"content-disposition": f'attachment; filename="{name}"'}
        )

    def refusal(
        self, status: int, code: str, message: str, session: Session | None = None, back: str = ""
    ) -> HTMLResponse:
        """The error page; ``back`` is the list to offer a way back to (a path in :data:`BACK`)."""
        href, label = back, BACK.get(back, "")
        if not label:
            href, label = "/collectors", BACK["/collectors"]
        return self.page(
            "error.html", status, session=session, code=code, message=message, back=href, back_label=label
        )

    def failed(self, exc: VersusError, session: Session, back: str = "") -> HTMLResponse:
        """A service's refusal, with its status by the one table (common/error_mapping.py)."""
        return self.refusal(status_for(exc).http_status, exc.code, exc.message, session, back)

    async def session(self, request: Request) -> Session | None:
        return await self.sessions.load(request.cookies.get(COOKIE))

    def signed_in(
        self, handler: Callable[[Request, Session], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A page handler that needs a session: without one the browser goes to the sign-in page."""

        async def page(request: Request) -> Response:
            session = await self.session(request)
            if session is None:
                return RedirectResponse("/signin", status_code=303)
            return await handler(request, session)

        return page

    async def checked_post(self, request: Request) -> tuple[Session, dict[str, str]]:
        """The session and form of a POST, after the origin and CSRF checks."""
        security.same_origin(
            self.origins, request.headers.get("origin"), request.headers.get("sec-fetch-site")
        )
        session = await self.session(request)
        if session is None:
            raise security.Refused(401, "session_missing", "sign in first")
        fields = security.form(await request.body())
        if not session.csrf_matches(fields.get("csrf", "")):
            raise security.Refused(403, "csrf_invalid", "the form's CSRF token is missing or wrong")
        return session, fields
