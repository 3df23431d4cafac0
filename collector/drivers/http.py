"""``http`` - calls a device's HTTPS API.

    get      read             GET a URL
    request  mutate_terminal  any method, optional body

Params (JSON): ``{"path": "/api/...", "method": "POST", "headers": {...}, "body_b64": "..."}``. The
device's base URL, CA file and credentials come from the collector's local
credentials (vault mode A), keyed by target_ref, so they never travel in a task::

    {"http": {"<target_ref>": {"base_url": "https://10.0.0.5", "ca_file": "/etc/...", "bearer": "..."}}}
"""

from __future__ import annotations

import base64
import json
import ssl
from typing import ClassVar

import httpx

from collector.drivers.base import DriverContext, DriverError, Operation, Outcome, Task

MAX_RESPONSE_BYTES = 512 * 1024


class HttpDriver:
    provider: ClassVar[str] = "http"
    max_concurrency: ClassVar[int] = 8
    operations: ClassVar[dict[str, Operation]] = {
        "get": Operation("read", timeout_s=30),
        "request": Operation("mutate_terminal", timeout_s=60),
    }

    def __init__(self, ctx: DriverContext):
        self.credentials = ctx.credentials

    async def execute(self, task: Task) -> Outcome:
        # One snapshot per task: a credential replaced on disk meanwhile applies from the next task.
        raw = task.device_credential(self.credentials, "http")
        if raw is None:
            raise DriverError("no_credentials", f"no local http settings for {task.target_ref!r}")
        target = task.hold(raw)  # the copy a revocation wipes
        params = json.loads(task.params or b"{}")
        method = "GET" if task.operation == "get" else str(params.get("method", "POST")).upper()
        headers = dict(params.get("headers", {}))
        if "bearer" in target:
            headers["Authorization"] = f"Bearer {target['bearer']}"
        verify: ssl.SSLContext | bool = True
        if target.get("ca_file"):
            verify = ssl.create_default_context(cafile=target["ca_file"])
        body = base64.b64decode(params.get("body_b64", "")) if params.get("body_b64") else None
        try:
            async with httpx.AsyncClient(base_url=target["base_url"], verify=verify, timeout=30) as client:
                task.check_window()
                response = await client.request(
                    method, params.get("path", "/"), headers=headers, content=body
                )
        except httpx.TimeoutException as exc:
            # The request may or may not have reached the device.
            return Outcome("unknown", b"", "http_timeout", str(exc)[:200])
        except httpx.HTTPError as exc:
            return Outcome("failed", b"", "http_unreachable", str(exc)[:200])
        result = json.dumps(
            {
                "status": response.status_code,
                "body_b64": base64.b64encode(response.content[:MAX_RESPONSE_BYTES]).decode(),
            }
        ).encode()
        return Outcome(
            "success" if response.is_success else "failed",
            result,
            "" if response.is_success else f"http_{response.status_code}",
        )
