"""Collector updates: the TUF repository of releases (router/releases/update_repo.py), read-only.

    GET /api/collector/v1/updates/metadata/{name}   root, targets, snapshot, timestamp metadata
    GET /api/collector/v1/updates/targets/{name}    a release artifact, by its hashed name

Bearer auth as every collector call (an active collector); names are plain
file names of the repository (``<N>.root.json``, ``timestamp.json``,
``<sha256>.<file>``), anything else is 404 ``update_not_found``. Sizes are
bounded by what TUF clients accept (metadata) and by the publish limit
(artifacts): a file larger is never served. The client verifies everything
(signatures, versions, expiry, hashes and lengths); the gateway only hands out
files, so it needs no key.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from common.errors import NotFound
from common.limits import MAX_ARTIFACT_BYTES
from gateway.auth import authenticate

router = APIRouter(prefix="/api/collector/v1/updates", tags=["updates"])

METADATA_NAME = re.compile(r"(?:[1-9][0-9]{0,9}\.(?:root|targets|snapshot)|timestamp)\.json")
TARGET_NAME = re.compile(r"[0-9a-f]{64}\.[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
# The largest root metadata python-tuf's client accepts (UpdaterConfig.root_max_length).
MAX_METADATA_BYTES = 512_000


class UpdateNotFound(NotFound):
    def __init__(self) -> None:
        super().__init__("no such update file", code="update_not_found")


def _file(request: Request, kind: str, name: str, pattern: re.Pattern[str], limit: int) -> Path:
    directory: Path | None = request.app.state.updates_dir
    if directory is None or not pattern.fullmatch(name):
        raise UpdateNotFound()
    path = directory / kind / name
    try:
        size = path.stat().st_size
    except OSError:
        raise UpdateNotFound() from None
    if size > limit:
        raise UpdateNotFound()
    return path


@router.get("/metadata/{name}")
async def metadata(request: Request, name: str) -> FileResponse:
    """A metadata file of the update repository."""
    await authenticate(request, request.app.state.store)
    path = _file(request, "metadata", name, METADATA_NAME, MAX_METADATA_BYTES)
    return FileResponse(path, media_type="application/json", headers={"Cache-Control": "no-store"})


@router.get("/targets/{name}")
async def target(request: Request, name: str) -> FileResponse:
    """A release artifact; its hash and length are in the signed targets metadata."""
    await authenticate(request, request.app.state.store)
    path = _file(request, "targets", name, TARGET_NAME, MAX_ARTIFACT_BYTES)
    return FileResponse(path, media_type="application/octet-stream")
