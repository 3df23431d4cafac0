"""The update repository through the gateway: python-tuf's client, signing every request as a collector
does, downloads a release over a real socket; the gateway hands out nothing else (gateway/updates_api.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import httpx
import pytest
from tuf.ngclient import Updater

from collector.update_fetcher import GatewayFetcher, repository_urls
from common.trust.keys import KeyPurpose, KeySet
from router.releases.update_repo import UpdateRepository
from tests.integration import test_gateway_collector as gw
from tests.support.collector_auth import bound_token

pytestmark = pytest.mark.timeout(60)

stack = gw.stack
Stack = gw.Stack

NOW = dt.datetime.now(dt.UTC)
RELEASE = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)


def _published(updates: Path, tmp_path: Path) -> tuple[UpdateRepository, Path]:
    repo = UpdateRepository(updates)
    repo.ensure(RELEASE, NOW)
    artifact = tmp_path / "versus_collector-1.2.0-py3-none-any.whl"
    artifact.write_bytes(b"a collector release" * 4096)
    repo.publish(RELEASE, artifact, artifact.name, {"version": "1.2.0", "channel": "stable"}, NOW)
    return repo, artifact


async def test_a_collector_downloads_a_release_through_the_gateway_with_tuf(
    stack: Stack, tmp_path: Path
) -> None:
    c = await stack.enroll("col-upd")
    repo, artifact = _published(stack.app.state.updates_dir, tmp_path)
    metadata_url, targets_url = repository_urls(stack.url)
    fetcher = GatewayFetcher(ssl.create_default_context(), c.key, c.collector_id)

    def download() -> bytes:
        local = tmp_path / "client"
        (local / "metadata").mkdir(parents=True)
        (local / "targets").mkdir()
        updater = Updater(str(local / "metadata"), metadata_url, str(local / "targets"), targets_url,
                          fetcher=fetcher, bootstrap=repo.root_json(1))  # fmt: skip
        updater.refresh()
        info = updater.get_targetinfo(artifact.name)
        assert info is not None
        return Path(updater.download_target(info)).read_bytes()

    try:
        assert await asyncio.to_thread(download) == artifact.read_bytes()
    finally:
        fetcher.close()


async def test_only_repository_files_go_out_and_only_to_collectors(stack: Stack, tmp_path: Path) -> None:
    c = await stack.enroll("col-upd-2")
    _published(stack.app.state.updates_dir, tmp_path)
    (stack.app.state.updates_dir / "secret.json").write_text("{}")

    async def get(path: str, signed: bool = True) -> httpx.Response:
        full = "/api/collector/v1/updates" + path
        headers = (
            {"Authorization": f"Bearer {bound_token(c.key, c.collector_id, 'GET', full)}"} if signed else {}
        )
        async with httpx.AsyncClient(base_url=stack.url) as client:
            return await client.get(full, headers=headers)

    assert (await get("/metadata/1.root.json")).status_code == 200
    assert (await get("/metadata/1.root.json", signed=False)).status_code == 401
    for path in ("/metadata/secret.json", "/metadata/0.root.json", "/targets/1.root.json",
                 "/metadata/2.root.json", "/metadata/.root.json"):  # fmt: skip
        reply = await get(path)
        assert (reply.status_code, reply.json()["error"]["code"]) == (404, "update_not_found"), path
    # An encoded slash is decoded before routing: no route has a name with a slash in it.
    escaped = await get("/metadata/..%2Fsecret.json")
    assert (escaped.status_code, escaped.json()["error"]["code"]) == (404, "not_found")
