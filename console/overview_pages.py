"""The fleet overview, the console's landing page: what needs a look now, from the router's fleet
sample over gRPC (FleetService.GetFleetHealth) and the sites' names (EnrollmentService)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from common.errors import VersusError
from console.overview_views import SERIES, overview

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def home(request: Request, session: Session) -> Response:
        try:
            got = await backend.fleet_health(session.token)
            names = await backend.site_names(session.token, need=[s.site_id for s in got.sites])
        except VersusError as exc:
            if exc.code == "fleet_not_sampled":  # right after the router started: say so, and retry
                return console.page("overview.html", session=session, o=None, live=True)
            return console.failed(exc, session)
        return console.page(
            "overview.html", session=session, o=overview(got, names), series=SERIES, live=True
        )

    return [Route("/", console.signed_in(home))]
