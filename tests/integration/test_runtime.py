"""Startup checks a service process runs before serving."""

from __future__ import annotations

import pytest

from common.embedded.process import free_port
from common.errors import StartupError
from common.runtime.service import check_backends


def test_healthy_migrated_backends_pass(database_url: str, redis_url: str) -> None:
    check_backends(database_url, redis_url)


def test_unmigrated_database_is_refused(empty_database_url: str, redis_url: str) -> None:
    with pytest.raises(StartupError, match=r"not at the latest schema .* run `versus-cp migrate`"):
        check_backends(empty_database_url, redis_url)


def test_unreachable_database_is_one_line(redis_url: str) -> None:
    port = free_port()
    with pytest.raises(StartupError) as info:
        check_backends(f"postgresql://versus:pw@127.0.0.1:{port}/versus", redis_url)
    assert info.value.message.startswith(f"cannot connect to PostgreSQL at 127.0.0.1:{port}/versus")
    assert "\n" not in info.value.message and "pw" not in info.value.message.split("versus", 1)[0]


def test_unreachable_redis_is_one_line(database_url: str) -> None:
    port = free_port()
    with pytest.raises(StartupError, match=f"cannot connect to Redis at 127.0.0.1:{port}"):
        check_backends(database_url, f"redis://127.0.0.1:{port}/0")
