from __future__ import annotations

import grpc
import psycopg
import pytest
from redis import exceptions as redis_exc
from sqlalchemy import exc as sa_exc

from common import error_mapping, errors


@pytest.mark.parametrize(
    ("error", "http", "code"),
    [
        (errors.InvalidArgument("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.Unauthenticated("x"), 401, grpc.StatusCode.UNAUTHENTICATED),
        (errors.PermissionDenied("x"), 403, grpc.StatusCode.PERMISSION_DENIED),
        (errors.NotFound("x"), 404, grpc.StatusCode.NOT_FOUND),
        (errors.Conflict("x"), 409, grpc.StatusCode.ALREADY_EXISTS),
        (errors.FailedPrecondition("x"), 412, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.RequestTimeout("x"), 408, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.PayloadTooLarge("x"), 413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.UnsupportedMediaType("x"), 415, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.ResourceExhausted("x"), 429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Unavailable("x"), 503, grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineExceeded("x"), 504, grpc.StatusCode.DEADLINE_EXCEEDED),
    ],
)
def test_each_kind_maps_to_all_transports(
    error: errors.VersusError, http: int, code: grpc.StatusCode
) -> None:
    status = error_mapping.status_for(error)
    assert status.http_status == http
    assert status.grpc_code == code
    assert status.ws_close_code == 4000 + http


def test_subclass_with_specific_code_inherits_its_kind() -> None:
    class TokenExpired(errors.Unauthenticated):
        default_code = "token_expired"

    err = TokenExpired("token has expired")
    assert err.code == "token_expired"
    assert error_mapping.status_for(err).http_status == 401
    assert err.to_dict() == {"error": {"code": "token_expired", "message": "token has expired"}}


def test_unexpected_exceptions_are_internal_and_do_not_leak() -> None:
    boom = RuntimeError("connection string postgresql://u:pw@db")
    assert error_mapping.status_for(boom).http_status == 500
    public = error_mapping.public_error(boom)
    assert public.code == "internal"
    assert "pw@db" not in public.message


def test_grpc_failure_round_trips_to_domain_error() -> None:
    err = error_mapping.from_grpc(grpc.StatusCode.NOT_FOUND, "no such task", "task_not_found")
    assert isinstance(err, errors.NotFound)
    assert err.code == "task_not_found"
    assert error_mapping.status_for(err).http_status == 404
    unknown = error_mapping.from_grpc(grpc.StatusCode.DATA_LOSS, "", None)
    assert unknown.code == "internal"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (
            sa_exc.OperationalError("SELECT 1", {}, Exception("server closed the connection")),
            "database_unavailable",
        ),
        (
            sa_exc.InterfaceError("SELECT 1", {}, Exception("connection already closed")),
            "database_unavailable",
        ),
        (sa_exc.TimeoutError("QueuePool limit reached"), "database_unavailable"),
        # Raised on the driver itself (the router's hot path), not wrapped by SQLAlchemy.
        (psycopg.OperationalError("the connection is lost"), "database_unavailable"),
        (
            psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
            "database_unavailable",
        ),
        (redis_exc.ConnectionError("Connection refused"), "redis_unavailable"),
        (redis_exc.TimeoutError("Timeout reading from socket"), "redis_unavailable"),
    ],
)
def test_a_lost_dependency_is_retryable_not_internal(error: Exception, code: str) -> None:
    status = error_mapping.status_for(error)
    assert (status.http_status, status.grpc_code) == (503, grpc.StatusCode.UNAVAILABLE)
    public = error_mapping.public_error(error)
    assert public.code == code and "closed" not in public.message and "refused" not in public.message


def test_a_database_bug_stays_internal() -> None:
    integrity = sa_exc.IntegrityError(
        "INSERT", {}, Exception("duplicate key value violates unique constraint")
    )
    assert error_mapping.status_for(integrity).http_status == 500
    assert error_mapping.public_error(integrity).code == "internal"


def test_a_dependency_failure_is_described_by_its_driver_never_by_the_statement() -> None:
    class DriverError(Exception):
        sqlstate = "57P01"

    wrapped = sa_exc.OperationalError(
        "SELECT token_hash FROM tokens WHERE token_hash = %(h)s",
        {"h": "d2f1-secret-hash"},
        DriverError("terminating connection due to administrator command\nSSL SYSCALL error: EOF"),
    )
    detail = error_mapping.dependency_detail(wrapped)
    assert detail == "DriverError 57P01: terminating connection due to administrator command"
    assert "secret" not in detail and "SELECT" not in detail
    assert error_mapping.dependency_detail(redis_exc.ConnectionError("x" * 400)).startswith(
        "ConnectionError: xxx"
    )
    assert len(error_mapping.dependency_detail(redis_exc.ConnectionError("x" * 400))) < 200
    assert error_mapping.dependency_detail(sa_exc.TimeoutError()).startswith("TimeoutError")
