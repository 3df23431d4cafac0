"""Client Tools: the collector for each published platform to download for a manual or air-gapped
install (the newest of each marked latest), the values a supervisor installed by hand is given,
and the commands that install it as a service (docs/upgrades.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from common.errors import VersusError
from console.release_views import bundles

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

METADATA_PATH = "/api/collector/v1/updates/metadata/"


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def tools(request: Request, session: Session) -> Response:
        try:
            listed, manifest_url, pubkey = await backend.releases_for_tools(session.token)
        except VersusError as exc:
            return console.failed(exc, session)
        gateway = manifest_url.removesuffix(METADATA_PATH)
        return console.page(
            "tools.html", session=session, bundles=bundles(listed), manifest_url=manifest_url, pubkey=pubkey,
            gateway=gateway,
        )  # fmt: skip

    async def download(request: Request, session: Session) -> Response:
        q = request.query_params
        version, os_name, arch = q.get("version", "")[:64], q.get("os", "")[:32], q.get("arch", "")[:32]
        chunks = backend.download_release(session.token, version, os_name, arch)
        try:
            name, length, first = await anext(chunks)  # a refusal comes before any byte is sent
        except VersusError as exc:
            return console.failed(exc, session)

        async def body() -> AsyncIterator[bytes]:
            yield first
            async for _, _, data in chunks:
                yield data

        return StreamingResponse(
            body(), media_type="application/octet-stream",
            headers={"content-disposition": f'attachment; filename="{name}"', "content-length": str(length)},
        )  # fmt: skip

    return [
        Route("/tools", console.signed_in(tools)),
        Route("/tools/download", console.signed_in(download)),
    ]
