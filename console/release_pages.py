"""Releases (seed 001): every published collector version with who runs it, publishing a new
one (the artifact uploaded from the browser and streamed to the router, which checks its
length and SHA-256 and signs it into the update repository) and yanking one."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from typing import TYPE_CHECKING, BinaryIO

from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from common.errors import VersusError
from common.limits import MAX_ARTIFACT_BYTES, MAX_SBOM_BYTES
from common.telemetry.logs import get_logger
from console import security
from console.release_views import CHANNELS, Upload

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

log = get_logger("versus.console")
CHUNK_BYTES = 1 << 20
MAX_NOTES = 20_000
# The form's text fields (version, channel, os, arch, notes, csrf): each at most this long.
MAX_FIELD_BYTES = 64 * 1024
TOO_LARGE = f"an artifact is at most {MAX_ARTIFACT_BYTES} bytes"
DONE = {"published": "Release published.", "yanked": "Release yanked: no collector is sent to it again."}


def artifact_facts(file: BinaryIO) -> tuple[int, str]:
    """Length and SHA-256 (hex) of the uploaded artifact, read in chunks from its start."""
    file.seek(0)
    digest, length = hashlib.sha256(), 0
    for block in iter(lambda: file.read(CHUNK_BYTES), b""):
        digest.update(block)
        length += len(block)
    file.seek(0)
    return length, digest.hexdigest()


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def releases(request: Request, session: Session) -> Response:
        try:
            listed = await backend.releases(session.token)
            behind = await backend.behind(session.token)
        except VersusError as exc:
            return console.failed(exc, session)
        notice = DONE.get(request.query_params.get("done", ""), "")
        return console.page(
            "releases.html", session=session, releases=listed, behind=behind, notice=notice,
            channels=list(CHANNELS),
        )  # fmt: skip

    async def confirm_yank(request: Request, session: Session) -> Response:
        return console.page("confirm_yank.html", session=session, version=request.path_params["version"])

    async def yank(request: Request) -> Response:
        try:
            session, fields = await console.checked_post(request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        version = request.path_params["version"]
        try:
            await backend.yank(session.token, version, fields.get("reason", "").strip()[:500])
        except VersusError as exc:
            return console.failed(exc, session)
        log.info("console action", operator=session.name, action="yank", version=version)
        return RedirectResponse("/releases?done=yanked", status_code=303)

    async def publish(request: Request) -> Response:
        try:
            session, form = await _upload_form(console, request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        try:
            text = {k: v for k, v in form.items() if isinstance(v, str)}
            if not session.csrf_matches(text.get("csrf", "")):
                return console.refusal(403, "csrf_invalid", "the form's CSRF token is missing or wrong")
            artifact = form.get("artifact")
            if not isinstance(artifact, UploadFile) or not artifact.filename:
                return console.refusal(400, "artifact_missing", "choose the release's artifact file", session)
            size, sha256 = await asyncio.to_thread(artifact_facts, artifact.file)  # up to 256 MiB
            if size > MAX_ARTIFACT_BYTES:
                return console.refusal(413, "artifact_too_large", TOO_LARGE, session)
            upload = Upload(
                version=text.get("version", "").strip(), channel=text.get("channel", ""),
                security_fix=text.get("security_fix") == "1", os=text.get("os", "").strip(),
                arch=text.get("arch", "").strip(), notes=text.get("notes", "")[:MAX_NOTES],
            )  # fmt: skip
            chosen = form.get("sbom")
            if isinstance(chosen, UploadFile) and chosen.filename:
                sbom = await chosen.read(MAX_SBOM_BYTES + 1)
                if len(sbom) > MAX_SBOM_BYTES:
                    too_large = f"an SBOM is at most {MAX_SBOM_BYTES} bytes"
                    return console.refusal(413, "sbom_too_large", too_large, session)
                upload = dataclasses.replace(upload, sbom=sbom)
            elif text.get("no_sbom") != "1":
                # As `versus-cp releases publish`: a release without its SBOM is a choice, not a slip.
                missing = "choose the release's SBOM, or tick 'Publish without an SBOM'"
                return console.refusal(400, "sbom_missing", missing, session)
            if upload.channel not in CHANNELS:
                return console.refusal(400, "channel_invalid", "choose stable or beta", session)
            try:
                await backend.publish(session.token, upload, artifact.file, size, sha256)
            except VersusError as exc:
                return console.failed(exc, session)
        finally:
            await form.close()  # the spooled artifact's temporary file
        log.info("console action", operator=session.name, action="publish", version=upload.version)
        return RedirectResponse("/releases?done=published", status_code=303)

    return [
        Route("/releases", console.signed_in(releases)),
        Route("/releases/publish", publish, methods=["POST"]),
        Route("/releases/{version}/confirm/yank", console.signed_in(confirm_yank)),
        Route("/releases/{version}/yank", yank, methods=["POST"]),
    ]


async def _upload_form(console: Console, request: Request) -> tuple[Session, FormData]:
    """The session and multipart form of a publish, after the origin check and within the limits
    (the CSRF token is a field of the form, checked by the caller)."""
    headers = request.headers
    security.same_origin(console.origins, headers.get("origin"), headers.get("sec-fetch-site"))
    session = await console.session(request)
    if session is None:
        raise security.Refused(401, "session_missing", "sign in first")
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_ARTIFACT_BYTES + MAX_FIELD_BYTES:
        raise security.Refused(413, "artifact_too_large", TOO_LARGE)
    try:
        form = await request.form(max_files=2, max_fields=8, max_part_size=MAX_FIELD_BYTES)
    except MultiPartException as exc:
        raise security.Refused(400, "invalid_body", f"the upload could not be read: {exc.message}") from None
    return session, form
