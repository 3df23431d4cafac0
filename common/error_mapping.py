"""The one mapping from domain errors to HTTP statuses, gRPC codes and WebSocket close codes.

WebSocket close codes use the private-use range 4000-4999 so a collector can
tell an application refusal from a transport failure: 4000 + the HTTP status
that the same error would carry on the per-call HTTPS path (4400, 4401, ...).
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from typing import Any

import grpc

from common import errors


@dataclass(frozen=True, slots=True)
class TransportStatus:
    """How one kind of domain error appears on each transport."""

    http_status: int
    grpc_code: grpc.StatusCode

    @property
    def ws_close_code(self) -> int:
        return 4000 + self.http_status


_BY_KIND: dict[type[errors.VersusError], TransportStatus] = {
    errors.InvalidArgument: TransportStatus(400, grpc.StatusCode.INVALID_ARGUMENT),
    errors.Unauthenticated: TransportStatus(401, grpc.StatusCode.UNAUTHENTICATED),
    errors.PermissionDenied: TransportStatus(403, grpc.StatusCode.PERMISSION_DENIED),
    errors.NotFound: TransportStatus(404, grpc.StatusCode.NOT_FOUND),
    errors.Conflict: TransportStatus(409, grpc.StatusCode.ALREADY_EXISTS),
    errors.FailedPrecondition: TransportStatus(412, grpc.StatusCode.FAILED_PRECONDITION),
    errors.PayloadTooLarge: TransportStatus(413, grpc.StatusCode.RESOURCE_EXHAUSTED),
    errors.UnsupportedMediaType: TransportStatus(415, grpc.StatusCode.INVALID_ARGUMENT),
    errors.ResourceExhausted: TransportStatus(429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    errors.Unavailable: TransportStatus(503, grpc.StatusCode.UNAVAILABLE),
    errors.DeadlineExceeded: TransportStatus(504, grpc.StatusCode.DEADLINE_EXCEEDED),
    errors.RequestTimeout: TransportStatus(408, grpc.StatusCode.DEADLINE_EXCEEDED),
    errors.ConfigError: TransportStatus(500, grpc.StatusCode.INTERNAL),
    errors.StartupError: TransportStatus(500, grpc.StatusCode.INTERNAL),
}
_INTERNAL = TransportStatus(500, grpc.StatusCode.INTERNAL)

_GRPC_TO_KIND: dict[grpc.StatusCode, type[errors.VersusError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
}

# Trailing metadata key carrying the stable code across gRPC hops.
GRPC_CODE_METADATA_KEY = "versus-error-code"
# And the error's details (JSON), when it has any: machine-readable context such as an ack offset.
GRPC_DETAILS_METADATA_KEY = "versus-error-details"


def _infrastructure(error: BaseException) -> errors.VersusError | None:
    """A lost PostgreSQL or Redis connection as a retryable domain error (503 / UNAVAILABLE).

    A database restart or network blip is not a bug in the request: callers should back
    off and retry, and they can tell which dependency failed from the code.

    The drivers' exception modules are looked up, not imported: an error of theirs exists only
    once they are loaded, and a command-line call that never touches a database skips their
    import (a quarter of a second).
    """
    sa_exc: Any = sys.modules.get("sqlalchemy.exc")
    redis_exc: Any = sys.modules.get("redis.exceptions")
    if (
        sa_exc is not None
        and isinstance(error, sa_exc.DBAPIError)
        and (
            error.connection_invalidated or isinstance(error, sa_exc.OperationalError | sa_exc.InterfaceError)
        )
    ):
        return errors.Unavailable("the database is unavailable; retry shortly", code="database_unavailable")
    pg: Any = sys.modules.get("psycopg")
    if pg is not None and isinstance(error, pg.errors.ReadOnlySqlTransaction):
        # SQLSTATE 25006, raised on the driver itself (router/core/sql.py): the server
        # stopped taking writes, as a primary being retired does; the connection is already dropped.
        return errors.Unavailable(
            "the database is not taking writes; retry shortly", code="database_unavailable"
        )
    if pg is not None and isinstance(error, pg.OperationalError):  # the same failure, unwrapped
        return errors.Unavailable("the database is unavailable; retry shortly", code="database_unavailable")
    if sa_exc is not None and isinstance(
        error, sa_exc.TimeoutError
    ):  # no pooled connection came free in time
        return errors.Unavailable("the database is overloaded; retry shortly", code="database_unavailable")
    if redis_exc is not None and isinstance(error, redis_exc.ConnectionError | redis_exc.TimeoutError):
        return errors.Unavailable("Redis is unavailable; retry shortly", code="redis_unavailable")
    return None


_DETAIL_LIMIT = 160


def dependency_detail(error: BaseException) -> str:
    """What a failed dependency said, short and safe to log: the driver's class, the SQLSTATE when
    PostgreSQL sent one, and the first line of the driver's message.

    SQLAlchemy's own text is not used: it appends the statement and its parameters, which may
    carry token hashes or sealed material. The driver's first line is the server's primary
    message ("terminating connection due to administrator command", "sorry, too many clients
    already") or the client's ("connection refused"), which names hosts and users but never a
    password.
    """
    sa_exc: Any = sys.modules.get("sqlalchemy.exc")
    cause: BaseException = error
    if sa_exc is not None and isinstance(error, sa_exc.DBAPIError) and error.orig is not None:
        cause = error.orig
    elif sa_exc is not None and isinstance(error, sa_exc.TimeoutError):
        return "TimeoutError: no pooled connection came free in time"
    text = str(cause).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > _DETAIL_LIMIT:
        first = first[: _DETAIL_LIMIT - 1] + "\u2026"
    sqlstate = getattr(cause, "sqlstate", None)
    where = f"{type(cause).__name__} {sqlstate}" if sqlstate else type(cause).__name__
    return f"{where}: {first}" if first else where


def status_for(error: BaseException) -> TransportStatus:
    """Transport status for any exception; anything unexpected is an internal error."""
    error = _infrastructure(error) or error
    if isinstance(error, errors.VersusError):
        for kind in type(error).__mro__:
            if kind in _BY_KIND:
                return _BY_KIND[kind]
    return _INTERNAL


def public_error(error: BaseException) -> errors.VersusError:
    """The error as a caller may see it: unexpected exceptions never leak their text."""
    error = _infrastructure(error) or error
    if isinstance(error, errors.VersusError):
        return error
    return errors.VersusError("internal error", code="internal")


def from_grpc(
    code: grpc.StatusCode, details: str, versus_code: str | None, error_details: str | None = None
) -> errors.VersusError:
    """Rebuild a domain error from a gRPC failure so the gateway can re-map it for collectors
    (``error_details``: the JSON of its details, from trailing metadata)."""
    kind = _GRPC_TO_KIND.get(
        code, errors.Unavailable if code == grpc.StatusCode.CANCELLED else errors.VersusError
    )
    parsed: Any = None
    if error_details:
        with contextlib.suppress(ValueError):
            parsed = json.loads(error_details)
    return kind(
        details or code.name.lower(),
        code=versus_code or None,
        details=parsed if isinstance(parsed, dict) else None,
    )


def trailing_metadata(error: errors.VersusError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries ``error``'s code (and details) to the caller."""
    pairs = [(GRPC_CODE_METADATA_KEY, error.code)]
    if error.details:
        pairs.append((GRPC_DETAILS_METADATA_KEY, json.dumps(error.details, separators=(",", ":"))))
    return tuple(pairs)


def from_rpc_error(exc: grpc.RpcError, unreachable: errors.VersusError) -> errors.VersusError:
    """The domain error behind a failed call to another control-plane service (its stable code
    travels in trailing metadata); ``unreachable`` when the service did not answer in time."""
    code: grpc.StatusCode = exc.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return unreachable
    metadata: Any = exc.trailing_metadata() or ()
    versus_code = next((v for k, v in metadata if k == GRPC_CODE_METADATA_KEY), None)
    return from_grpc(code, exc.details() or "", versus_code)
