"""Where a running `versus-cp up` listens, so operator commands find it without port variables.

`up` writes ``<state>/endpoints.json`` once every service is ready and removes it when it
stops. An operator command that was not told where the router and enrollment service are
(no ``VERSUS_ROUTER_PORT``/``_HOST``/``_TARGET`` nor the enrollment equivalents) uses the
addresses of the `up` running on the same state directory. Explicit settings always win.

It also names the URLs of the embedded PostgreSQL and Redis (``database_url``, ``redis_url``;
null for a server of the operator's own, whose URL the operator already has and which may hold a
password), so another gateway or router can run beside `up` against the same backends
(docs/configuration.md). They are Unix-socket URLs with no secret in them: the sockets' directory
is the server user's, mode 0700.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from common.config.settings import Settings
from common.runtime import pids

FILE_NAME = "endpoints.json"
_ROUTER_FIELDS = {"router_host", "router_port", "router_target"}
_ENROLLMENT_FIELDS = {"enrollment_host", "enrollment_port", "enrollment_target"}


def write(
    settings: Settings, state: Path, database_url: str | None = None, redis_url: str | None = None
) -> Path:
    """Record this `up`'s addresses (called once its services are ready); ``database_url`` and
    ``redis_url`` only for embedded servers."""
    path = state / FILE_NAME
    record = {
        "pid": os.getpid(),
        "router": settings.router_address,
        "enrollment": settings.enrollment_address,
        "gateway_url": settings.gateway_url,
        "database_url": database_url,
        "redis_url": redis_url,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)
    return path


def remove(state: Path) -> None:
    (state / FILE_NAME).unlink(missing_ok=True)


def apply(settings: Settings) -> Settings:
    """``settings`` with the router and enrollment addresses of a running `up`, where not set."""
    path = settings.state_dir / FILE_NAME
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return settings
    if not isinstance(record, dict) or not pids.running(record.get("pid")):
        return settings
    update: dict[str, str] = {}
    explicit = settings.model_fields_set
    if not explicit & _ROUTER_FIELDS and isinstance(record.get("router"), str):
        update["router_target"] = record["router"]
    if not explicit & _ENROLLMENT_FIELDS and isinstance(record.get("enrollment"), str):
        update["enrollment_target"] = record["enrollment"]
    return settings.model_copy(update=update) if update else settings
