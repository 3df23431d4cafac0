"""Domain errors with stable machine-readable codes.

Every error the control plane returns to a caller is a :class:`VersusError`.
Its *kind* (the subclass) says how it maps onto transports — see
:mod:`common.error_mapping`, the only place that knows about HTTP statuses,
gRPC codes and WebSocket close codes. Its *code* is a stable snake_case string
that clients may match on; its message is for humans and may change.

This module has no I/O imports so protocol logic can raise these freely.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class VersusError(Exception):
    """Base class: a failure with a stable code and a human message."""

    default_code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, code: str | None = None, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.details: dict[str, Any] = dict(details or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"

    def to_dict(self) -> dict[str, Any]:
        """The JSON body used on the HTTP edge: ``{"error": {"code", "message", ...}}``."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return {"error": body}


class InvalidArgument(VersusError):
    """The request itself is malformed or out of range."""

    default_code = "invalid_argument"


class NotFound(VersusError):
    default_code = "not_found"


class Conflict(VersusError):
    """The request collides with existing state (e.g. same key, different request)."""

    default_code = "conflict"


class FailedPrecondition(VersusError):
    """The request is well formed but the system is not in a state to accept it."""

    default_code = "failed_precondition"


class Unauthenticated(VersusError):
    default_code = "unauthenticated"


class PermissionDenied(VersusError):
    default_code = "permission_denied"


class UnsupportedMediaType(VersusError):
    """The request body is not in a format the endpoint accepts."""

    default_code = "unsupported_media_type"


class ResourceExhausted(VersusError):
    """A queue, quota or capacity limit was reached."""

    default_code = "resource_exhausted"


class PayloadTooLarge(VersusError):
    """A body or frame is over its documented size limit."""

    default_code = "payload_too_large"


class Unavailable(VersusError):
    """A dependency (database, Redis, another service) cannot be reached right now."""

    default_code = "unavailable"


class DeadlineExceeded(VersusError):
    default_code = "deadline_exceeded"


class RequestTimeout(VersusError):
    """The caller was too slow sending its request (for example a body that trickles in)."""

    default_code = "request_timeout"


class ConfigError(VersusError):
    """Configuration is invalid; raised at startup, reported as one line."""

    default_code = "config_invalid"


class StartupError(VersusError):
    """A process could not start (port in use, unreachable database, ...)."""

    default_code = "startup_failed"
