"""An HTTPS server that serves a real update repository with faults, as a compromised or failing
gateway would (tests only).

It serves the files the real repository writer made (router/releases/update_repo.py) under the
gateway's update path, over TLS with a gateway certificate the collector trusts, and answers a
path given a fault the way a broken network or a hostile server does:

``cut``      Content-Length of the whole file, half of it, then the connection closes.
``short``    the whole file, a Content-Length 100 bytes larger, then the connection closes.
``gzip``     ``Content-Encoding: gzip`` on a body that is not gzip.
``slow``     nothing for ``delay_s``, then the file.
``stall``    headers, a first byte, then nothing until the client goes.
``endless``  a body that never ends (no length; chunked).
``as:PATH``  the bytes of another file of the repository (a signed targets document as a root).
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "/api/collector/v1/updates/"


class HostileRepo:
    def __init__(self, root: Path, cert: Path, key: Path, delay_s: float = 20.0):
        self.root = root
        self.delay_s = delay_s
        # Path relative to the repository ("metadata/1.root.json", "targets/<file>") -> fault; a key
        # ending in "/" covers every path under it.
        self.faults: dict[str, str] = {}
        self.served: list[str] = []
        self._closing = threading.Event()
        handler = type("Handler", (_Handler,), {"repo": self})
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def metadata_url(self) -> str:
        return f"https://127.0.0.1:{self._httpd.server_address[1]}{PREFIX}metadata/"

    def fault_for(self, relative: str) -> str:
        if relative in self.faults:
            return self.faults[relative]
        for key, fault in self.faults.items():
            if key.endswith("/") and relative.startswith(key):
                return fault
        return ""

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    repo: HostileRepo
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        relative = self.path.split("?", 1)[0].removeprefix(PREFIX)
        self.repo.served.append(relative)
        fault = self.repo.fault_for(relative)
        source = self.repo.root / (fault[3:] if fault.startswith("as:") else relative)
        if not source.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = source.read_bytes()
        with contextlib.suppress(OSError):  # the client gave up, as it should
            self._answer(fault, body)
        if fault in ("cut", "short", "stall", "endless"):
            self.close_connection = True

    def _answer(self, fault: str, body: bytes) -> None:
        if fault == "slow":
            self.repo._closing.wait(self.repo.delay_s)
        if fault == "endless":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 65536
            while not self.repo._closing.is_set():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            return
        self.send_response(200)
        length = len(body) + (100 if fault == "short" else 0)
        self.send_header("Content-Length", str(length))
        if fault == "gzip":
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        if fault == "cut":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self._drop()
        elif fault == "stall":
            self.wfile.write(body[:1])
            self.wfile.flush()
            self.repo._closing.wait(self.repo.delay_s)
        else:
            self.wfile.write(body)
            self.wfile.flush()
            if fault == "short":
                self._drop()

    def _drop(self) -> None:
        """Close the connection mid-answer, as a process killed or a link lost would."""
        self.connection.shutdown(socket.SHUT_RDWR)


@contextmanager
def hostile_repo(root: Path, cert: Path, key: Path, delay_s: float = 20.0) -> Iterator[HostileRepo]:
    server = HostileRepo(root, cert, key, delay_s)
    try:
        yield server
    finally:
        server.close()
