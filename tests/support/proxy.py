"""A TLS man in the middle between collector and gateway that rewrites claim responses, for attack tests."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from common.embedded.process import free_port
from common.trust.ca_store import CaStore
from common.trust.tls import ensure_gateway_tls

Rewrite = Callable[[bytes], bytes]


class TamperingProxy:
    """Serves HTTPS with a certificate from the gateway's own CA, so the collector trusts it."""

    def __init__(self, directory: Path, gateway_tls_dir: Path, upstream: str, rewrite_envelope: Rewrite):
        directory.mkdir(parents=True, exist_ok=True)
        # A server certificate from the gateway's active CA (its store is beside its TLS directory).
        tls = ensure_gateway_tls(directory, "localhost", [], CaStore(gateway_tls_dir.parent))
        self.port = free_port()
        self.rewritten = 0
        upstream_ca = ssl.create_default_context(cafile=str(gateway_tls_dir / "gateway-ca.pem"))

        async def forward(request: Request) -> Response:
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            async with httpx.AsyncClient(verify=upstream_ca, timeout=60) as client:
                upstream_reply = await client.request(
                    request.method, upstream + request.url.path, content=await request.body(), headers=headers
                )
            content = upstream_reply.content
            if request.url.path.endswith("/claim") and upstream_reply.status_code == 200:
                marker = b'"envelope":'
                head, envelope = content.split(marker, 1)
                content = head + marker + rewrite_envelope(envelope[:-1]) + b"}"
                self.rewritten += 1
            kept = {k: v for k, v in upstream_reply.headers.items() if k.lower().startswith("x-versus")}
            media_type = upstream_reply.headers.get("content-type")
            return Response(
                content, status_code=upstream_reply.status_code, headers=kept, media_type=media_type
            )

        app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=self.port,
                ssl_certfile=str(tls.cert_file),
                ssl_keyfile=str(tls.key_file),
                log_config=None,
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
