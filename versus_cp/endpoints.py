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


def _running(settings: Settings) -> dict[str, object] | None:
    try:
        record = json.loads((settings.state_dir / FILE_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not pids.running(record.get("pid")):
        return None
    return record


def with_database(settings: Settings) -> Settings:
    """``settings`` with the embedded PostgreSQL of a running `up` on this state directory when
    ``DATABASE_URL`` is not set (commands that work on the database itself: `backup`)."""
    if settings.database_url:
        return settings
    record = _running(settings)
    url = None if record is None else record.get("database_url")
    return settings.model_copy(update={"database_url": url}) if isinstance(url, str) else settings


def apply(settings: Settings) -> Settings:
    """``settings`` with the router and enrollment addresses of a running `up`, where not set."""
    record = _running(settings)
    if record is None:
        return settings
    update: dict[str, str] = {}
    explicit = settings.model_fields_set
    router, enrollment = record.get("router"), record.get("enrollment")
    if not explicit & _ROUTER_FIELDS and isinstance(router, str):
        update["router_target"] = router
    if not explicit & _ENROLLMENT_FIELDS and isinstance(enrollment, str):
        update["enrollment_target"] = enrollment
    return settings.model_copy(update=update) if update else settings
