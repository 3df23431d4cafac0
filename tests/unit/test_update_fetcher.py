"""The collector's update fetcher gives up on a slow or stalled download (TUF's slow-retrieval attack),
against a real HTTP server that trickles or stops."""

from __future__ import annotations

import http.server
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
from tuf.api import exceptions

from collector.update_fetcher import GatewayFetcher
from tests.support.pki import p256

pytestmark = pytest.mark.timeout(30)


class _Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        if self.path.endswith("/stall"):
            time.sleep(3)
            return
        try:
            for _ in range(1000):  # one byte every 50 ms: 50 s for the whole file
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_trickling_download_is_cut_at_the_deadline(server: str) -> None:
    fetcher = GatewayFetcher(ssl.create_default_context(), p256(), "col-1", deadline_s=1.0, read_timeout_s=5)
    started = time.monotonic()
    with pytest.raises(exceptions.SlowRetrievalError):
        b"".join(fetcher.fetch(server + "/api/collector/v1/updates/targets/trickle"))
    assert time.monotonic() - started < 3
    fetcher.close()


def test_a_stalled_download_times_out(server: str) -> None:
    fetcher = GatewayFetcher(ssl.create_default_context(), p256(), "col-1", read_timeout_s=0.5)
    with pytest.raises(exceptions.SlowRetrievalError):
        b"".join(fetcher.fetch(server + "/api/collector/v1/updates/targets/stall"))
    fetcher.close()
