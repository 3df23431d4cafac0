"""Bad configuration gives one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from common.embedded.process import free_port
from tests.e2e.harness import run_cli, service_env

pytestmark = pytest.mark.timeout(120)


def _assert_one_line_error(stderr: str, expected: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("versus-cp: error: "), stderr
    assert expected in lines[0], stderr
    assert "Traceback" not in stderr


def test_unreachable_database(tmp_path: Path) -> None:
    port = free_port()
    env = service_env(tmp_path / "state", DATABASE_URL=f"postgresql://versus:pw@127.0.0.1:{port}/versus")
    done = run_cli(["up"], env)
    assert done.returncode == 1
    _assert_one_line_error(done.stderr, f"cannot connect to PostgreSQL at 127.0.0.1:{port}/versus")
    assert not (tmp_path / "state" / "postgres").exists()


def test_unreachable_redis(tmp_path: Path) -> None:
    port = free_port()
    env = service_env(tmp_path / "state", REDIS_URL=f"redis://127.0.0.1:{port}/0")
    done = run_cli(["up"], env)
    assert done.returncode == 1
    _assert_one_line_error(done.stderr, f"cannot connect to Redis at 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("DATABASE_URL", "postgresql://db:port/versus", "DATABASE_URL: has an invalid port"),
        ("DATABASE_URL", "not a url", "DATABASE_URL: must be a postgresql:// URL"),
        (
            "REDIS_URL",
            "redis//cache",
            "REDIS_URL: must be a redis://, rediss://, unix:// or redis+sentinel://",
        ),
        ("VERSUS_GATEWAY_PORT", "eighty", "VERSUS_GATEWAY_PORT: Input should be a valid integer"),
    ],
)
def test_malformed_setting(tmp_path: Path, name: str, value: str, expected: str) -> None:
    done = run_cli(["up"], service_env(tmp_path / "state", **{name: value}))
    assert done.returncode == 2
    _assert_one_line_error(done.stderr, expected)


@pytest.mark.parametrize("port_name", ["gateway", "router", "enrollment_metrics"])
def test_port_already_in_use(tmp_path: Path, port_name: str) -> None:
    env = service_env(tmp_path / "state")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", int(env[f"VERSUS_{port_name.upper()}_PORT"])))
        blocker.listen()
        port = blocker.getsockname()[1]
        done = run_cli(["up"], env)
    assert done.returncode == 1
    _assert_one_line_error(done.stderr, f"cannot listen on 127.0.0.1:{port}")
    assert not (tmp_path / "state" / "postgres").exists()


def test_same_port_configured_twice(tmp_path: Path) -> None:
    env = service_env(tmp_path / "state")
    env["VERSUS_ROUTER_PORT"] = env["VERSUS_ENROLLMENT_PORT"]
    done = run_cli(["up"], env)
    assert done.returncode == 1
    _assert_one_line_error(done.stderr, "are both configured on")


def test_unwritable_state_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    done = run_cli(["up"], service_env(blocker / "state"))
    assert done.returncode == 2
    _assert_one_line_error(done.stderr, f"state directory {blocker / 'state'} is not writable")


def test_standalone_service_against_unmigrated_database(
    tmp_path: Path, empty_database_url: str, redis_url: str
) -> None:
    env = service_env(tmp_path / "state", DATABASE_URL=empty_database_url, REDIS_URL=redis_url)
    done = run_cli(["router"], env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith("run `versus-cp migrate`")
    migrated = run_cli(["migrate"], env)
    assert migrated.returncode == 0, migrated.stderr
    assert "schema is current" in migrated.stderr


def test_gateway_alone_without_a_service_token(tmp_path: Path, database_url: str, redis_url: str) -> None:
    env = service_env(tmp_path / "state", DATABASE_URL=database_url, REDIS_URL=redis_url)
    done = run_cli(["gateway"], env)
    assert done.returncode == 2
    _assert_one_line_error(done.stderr, "no service token: set VERSUS_SERVICE_TOKEN")


def test_operator_command_without_an_api_token(tmp_path: Path) -> None:
    done = run_cli(["collectors", "list"], service_env(tmp_path / "state"))
    assert done.returncode == 3  # not authenticated (docs/errors.md)
    _assert_one_line_error(done.stderr, "no API token: set VERSUS_API_TOKEN or VERSUS_API_TOKEN_FILE")


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "admin-token").write_text("vsk_whatever\n")
    (state / "admin-token").chmod(0o644)
    done = run_cli(["collectors", "list"], service_env(state))
    assert done.returncode == 2
    _assert_one_line_error(done.stderr, "is readable by others (mode 644)")
