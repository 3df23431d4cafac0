"""Sites (seed 001): the list, and per site its update policy and its enrollment tokens —
issue one (its plaintext and enroll command shown once), list them, revoke one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from common.errors import VersusError
from common.telemetry.logs import get_logger
from console import security
from console.site_views import APPROVALS, CHANNELS, POLICIES

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

log = get_logger("versus.console")


def _number(fields: dict[str, str], name: str) -> int:
    """A positive whole number from the form; the service judges its range (and says so)."""
    text = fields.get(name, "").strip()
    if not text.isdigit() or int(text) == 0:
        raise security.Refused(
            400, f"{name}_out_of_range", f"{name.replace('_', ' ')} must be a positive whole number"
        )
    return int(text)


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def sites(request: Request, session: Session) -> Response:
        try:
            listed, next_page = await backend.sites(session.token, request.query_params.get("page", "")[:500])
        except VersusError as exc:
            return console.failed(exc, session)
        return console.page("sites.html", session=session, sites=listed, next_page=next_page)

    async def site(request: Request, session: Session) -> Response:
        try:
            found, tokens = await backend.site(session.token, request.path_params["site_id"])
        except VersusError as exc:
            return console.failed(exc, session)
        notice = {"policy": "Update policy saved.", "revoked": "Token revoked."}.get(
            request.query_params.get("done", ""), ""
        )
        return console.page(
            "site.html", session=session, site=found, tokens=tokens, notice=notice, policies=list(POLICIES),
            channels=list(CHANNELS), approvals=list(APPROVALS),
        )  # fmt: skip

    async def policy(request: Request) -> Response:
        site_id = request.path_params["site_id"]
        try:
            session, fields = await console.checked_post(request)
            chosen, channel = fields.get("policy", ""), fields.get("channel", "stable")
            if chosen not in POLICIES or channel not in CHANNELS:
                raise security.Refused(
                    400, "update_policy_invalid", "choose manual, auto or pinned, and a channel"
                )
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        try:
            await backend.set_policy(
                session.token, site_id, chosen, fields.get("pinned_version", "").strip(), channel
            )
        except VersusError as exc:
            return console.failed(exc, session)
        log.info(
            "console action", operator=session.name, action="site_policy", site_id=site_id, policy=chosen
        )
        return RedirectResponse(f"/sites/{site_id}?done=policy", status_code=303)

    async def issue(request: Request) -> Response:
        site_id = request.path_params["site_id"]
        try:
            session, fields = await console.checked_post(request)
            max_uses, ttl_hours = _number(fields, "max_uses"), _number(fields, "ttl_hours")
            approval = fields.get("approval", "auto")
            if approval not in APPROVALS:
                raise security.Refused(400, "approval_mode_invalid", "approval must be auto or manual")
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        try:
            issued = await backend.issue_token(session.token, site_id, max_uses, ttl_hours * 3600, approval)
        except VersusError as exc:
            return console.failed(exc, session)
        log.info("console action", operator=session.name, action="issue_token", site_id=site_id,
                 token_id=issued.token.token_id)  # fmt: skip
        # Rendered, never redirected to: the plaintext exists only in this one answer (no-store).
        return console.page("token_issued.html", session=session, site_id=site_id, issued=issued)

    async def revoke(request: Request) -> Response:
        try:
            session, fields = await console.checked_post(request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        token_id, site_id = request.path_params["token_id"], fields.get("site_id", "")
        if fields.get("confirmed") != "yes":  # only the confirmation page's form revokes
            return console.refusal(
                400,
                "confirmation_required",
                "revoke a token from its confirmation page",
                session,
                back="/sites",
            )
        try:
            revoked = await backend.revoke_token(
                session.token, token_id, fields.get("with_collectors") == "yes"
            )
        except VersusError as exc:
            return console.failed(exc, session)
        log.info("console action", operator=session.name, action="revoke_token", token_id=token_id,
                 collectors=len(revoked))  # fmt: skip
        return RedirectResponse(f"/sites/{site_id}?done=revoked" if site_id else "/sites", status_code=303)

    async def confirm_revoke(request: Request, session: Session) -> Response:
        return console.page(
            "confirm_token.html", session=session, token_id=request.path_params["token_id"],
            site_id=request.query_params.get("site", "")[:200],
        )  # fmt: skip

    return [
        Route("/sites", console.signed_in(sites)),
        Route("/tokens/{token_id}/confirm", console.signed_in(confirm_revoke)),
        Route("/sites/{site_id}", console.signed_in(site)),
        Route("/sites/{site_id}/policy", policy, methods=["POST"]),
        Route("/sites/{site_id}/tokens", issue, methods=["POST"]),
        Route("/tokens/{token_id}/revoke", revoke, methods=["POST"]),
    ]
