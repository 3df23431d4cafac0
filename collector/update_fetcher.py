"""How the collector's TUF client (python-tuf ``ngclient``) reaches the update repository.

Update metadata and artifacts are served by the gateway to authenticated
collectors only (gateway/updates_api.py), so every download carries a bearer
token bound to its own method and path, like every other collector request. The
gateway is trusted for nothing here: ngclient verifies signatures, versions,
expiry, hashes and lengths, and stops reading at the length the signed metadata
names (an endless response is cut off). Each request has a deadline: a gateway
(or proxy) that trickles bytes cannot hold an update forever.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
from cryptography.hazmat.primitives.asymmetric import ec
from tuf.api import exceptions
from tuf.ngclient.fetcher import FetcherInterface

from collector.request_auth import bound_token

UPDATES_PATH = "/api/collector/v1/updates"
# A whole download must finish within this; reads stall out sooner.
DOWNLOAD_DEADLINE_S = 600.0
READ_TIMEOUT_S = 30.0


def repository_urls(gateway_url: str) -> tuple[str, str]:
    """The metadata and targets base URLs of the gateway's update repository."""
    base = gateway_url.rstrip("/") + UPDATES_PATH
    return base + "/metadata/", base + "/targets/"


class GatewayFetcher(FetcherInterface):
    """Fetch over HTTPS from the gateway, each request signed with the collector's key."""

    def __init__(
        self,
        context: ssl.SSLContext,
        key: ec.EllipticCurvePrivateKey,
        collector_id: str,
        *,
        deadline_s: float = DOWNLOAD_DEADLINE_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ):
        self._key = key
        self._collector_id = collector_id
        self.deadline_s = deadline_s
        timeout = httpx.Timeout(read_timeout_s, connect=read_timeout_s)
        self._client = httpx.Client(verify=context, timeout=timeout, trust_env=True)

    def close(self) -> None:
        self._client.close()

    def _fetch(self, url: str) -> Iterator[bytes]:
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        token = bound_token(self._key, self._collector_id, "GET", path)
        deadline = time.monotonic() + self.deadline_s
        request = self._client.build_request("GET", url, headers={"Authorization": f"Bearer {token}"})
        try:
            response = self._client.send(request, stream=True)
        except httpx.TimeoutException:
            raise exceptions.SlowRetrievalError(f"{path}: no answer in time") from None
        if response.status_code != 200:
            response.close()
            raise exceptions.DownloadHTTPError(f"{path}: HTTP {response.status_code}", response.status_code)
        return self._chunks(response, path, deadline)

    @staticmethod
    def _chunks(response: httpx.Response, path: str, deadline: float) -> Iterator[bytes]:
        try:
            # As the bytes arrive (no buffering up to a chunk size), so the deadline is checked while a
            # slow server trickles.
            for chunk in response.iter_bytes():
                if time.monotonic() > deadline:
                    raise exceptions.SlowRetrievalError(f"{path}: the download took too long")
                yield chunk
        except httpx.TimeoutException:
            raise exceptions.SlowRetrievalError(f"{path}: the download stalled") from None
        finally:
            response.close()
