"""How the collector's TUF client (python-tuf ``ngclient``) reaches the update repository.

Update metadata and artifacts are served by the gateway to authenticated
collectors only (gateway/updates_api.py), so every download carries a bearer
token bound to its own method and path, like every other collector request. The
gateway is trusted for nothing here: ngclient verifies signatures, versions,
expiry, hashes and lengths, and stops reading at the length the signed metadata
names (an endless response is cut off). Each request has a deadline: a gateway
(or proxy) that trickles bytes cannot hold an update forever.

Whatever breaks on the way - a refused or cut connection, a body shorter than its
``Content-Length``, a ``Content-Encoding`` the body does not have, a TLS error, a
stall - surfaces as python-tuf's ``DownloadError`` (``SlowRetrievalError`` for
time), both when the request is made and while its body is read: an update
attempt fails, the supervisor never does (docs/upgrades.md). The caller may set
an overall deadline (:attr:`GatewayFetcher.not_after`) and a cancel event, both
looked at before each request and with every chunk.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
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


class Cancel:
    """An attempt's cancel, which reaches into a blocked read: :meth:`set` shuts down the sockets
    of the downloads in flight, so a read waiting on a server that stopped sending ends at once
    instead of at its read timeout."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()
        with self._lock:
            for sock in self._sockets:
                _shutdown(sock)

    @contextlib.contextmanager
    def watching(self, sock: socket.socket | None) -> Iterator[None]:
        if sock is None:
            yield
            return
        with self._lock:
            self._sockets.add(sock)
            if self._event.is_set():
                _shutdown(sock)
        try:
            yield
        finally:
            with self._lock:
                self._sockets.discard(sock)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


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
        cancelled: Cancel | None = None,
    ):
        self._key = key
        self._collector_id = collector_id
        self.deadline_s = deadline_s
        self.read_timeout_s = read_timeout_s
        # An overall deadline (time.monotonic()) over every request, set by the caller per attempt.
        self.not_after: float | None = None
        self.cancelled = cancelled or Cancel()
        timeout = httpx.Timeout(read_timeout_s, connect=read_timeout_s)
        self._client = httpx.Client(verify=context, timeout=timeout, trust_env=True)

    def close(self) -> None:
        self._client.close()

    def _deadline(self, path: str) -> float:
        """This request's deadline; refuses to start one when the attempt is cancelled or over."""
        if self.cancelled.is_set():
            raise exceptions.DownloadError(f"{path}: the update attempt was cancelled")
        deadline = time.monotonic() + self.deadline_s
        if self.not_after is not None:
            if time.monotonic() >= self.not_after:
                raise exceptions.SlowRetrievalError(f"{path}: the update attempt ran out of time")
            deadline = min(deadline, self.not_after)
        return deadline

    def _fetch(self, url: str) -> Iterator[bytes]:
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        deadline = self._deadline(path)
        token = bound_token(self._key, self._collector_id, "GET", path)
        # No single wait outlives the deadline, however generous the read timeout.
        wait = max(min(self.read_timeout_s, deadline - time.monotonic()), 0.001)
        request = self._client.build_request(
            "GET", url, headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(wait)
        )
        try:
            response = self._client.send(request, stream=True)
        except httpx.TimeoutException:
            raise exceptions.SlowRetrievalError(f"{path}: no answer in time") from None
        except (httpx.HTTPError, OSError) as exc:  # ssl.SSLError is an OSError
            raise exceptions.DownloadError(f"{path}: {_why(exc)}") from None
        if response.status_code != 200:
            response.close()
            raise exceptions.DownloadHTTPError(f"{path}: HTTP {response.status_code}", response.status_code)
        return self._chunks(response, path, deadline)

    def _chunks(self, response: httpx.Response, path: str, deadline: float) -> Iterator[bytes]:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        try:
            with self.cancelled.watching(sock if isinstance(sock, socket.socket) else None):
                yield from self._read(response, path, deadline)
        finally:
            response.close()

    def _read(self, response: httpx.Response, path: str, deadline: float) -> Iterator[bytes]:
        try:
            # As the bytes arrive (no buffering up to a chunk size), so the deadline is checked while a
            # slow server trickles.
            for chunk in response.iter_bytes():
                if self.cancelled.is_set():
                    raise exceptions.DownloadError(f"{path}: the update attempt was cancelled")
                if time.monotonic() > deadline:
                    raise exceptions.SlowRetrievalError(f"{path}: the download took too long")
                yield chunk
        except httpx.TimeoutException:
            raise exceptions.SlowRetrievalError(f"{path}: the download stalled") from None
        except (httpx.HTTPError, OSError) as exc:
            # A cut connection, a short body, a body that is not in its Content-Encoding: python-tuf
            # wraps only what _fetch raises, so what the body raises is turned into its error here.
            if self.cancelled.is_set():
                raise exceptions.DownloadError(f"{path}: the update attempt was cancelled") from None
            raise exceptions.DownloadError(f"{path}: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    """The exception's type and first line, for the report (never a URL's query or a token)."""
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
