from __future__ import annotations

from pathlib import Path

import pytest

from common.config.settings import CONFIG_FILE_ENV, LogFormat, load_settings
from common.errors import ConfigError

_ENV_PREFIXES = ("VERSUS_", "DATABASE_URL", "REDIS_URL")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(_ENV_PREFIXES):
            monkeypatch.delenv(name)


def test_defaults_are_loopback_and_embedded() -> None:
    s = load_settings()
    assert s.database_url is None and s.redis_url is None and s.embedded
    assert (s.gateway_host, s.gateway_port) == ("127.0.0.1", 8443)
    assert s.router_address == "127.0.0.1:50051"
    assert s.enrollment_address == "127.0.0.1:50052"
    assert s.gateway_url == "https://127.0.0.1:8443"
    assert s.log_format is LogFormat.CONSOLE


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db.internal:5433/versus")
    monkeypatch.setenv("REDIS_URL", "redis://cache:6380/2")
    monkeypatch.setenv("VERSUS_ROUTER_PORT", "6000")
    monkeypatch.setenv("VERSUS_GATEWAY_HOST", "0.0.0.0")
    monkeypatch.setenv("VERSUS_LOG_FORMAT", "json")
    s = load_settings()
    assert s.database_url == "postgresql://u:p@db.internal:5433/versus"
    assert s.redis_url == "redis://cache:6380/2"
    assert s.router_address == "127.0.0.1:6000"
    # A wildcard bind is reached over loopback.
    assert s.gateway_url == "https://127.0.0.1:8443"
    assert s.log_format is LogFormat.JSON
    assert not s.embedded


def test_toml_file_is_below_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "versus.toml"
    config.write_text('router_port = 7001\nenrollment_port = 7002\nlog_level = "debug"\n')
    monkeypatch.setenv(CONFIG_FILE_ENV, str(config))
    monkeypatch.setenv("VERSUS_ENROLLMENT_PORT", "7100")
    s = load_settings()
    assert s.router_port == 7001
    assert s.enrollment_port == 7100
    assert s.log_level == "DEBUG"


def test_toml_file_with_unknown_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "versus.toml"
    config.write_text("router_prot = 7001\n")
    monkeypatch.setenv(CONFIG_FILE_ENV, str(config))
    with pytest.raises(ConfigError, match="unknown settings: router_prot"):
        load_settings()


def test_missing_config_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_FILE_ENV, str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings()


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        ("DATABASE_URL", "mysql://db/versus", "DATABASE_URL: must be a postgresql:// URL"),
        ("DATABASE_URL", "postgresql://db:notaport/versus", "DATABASE_URL: has an invalid port"),
        ("DATABASE_URL", "postgresql:///versus", "DATABASE_URL: names no host"),
        (
            "REDIS_URL",
            "http://cache",
            "REDIS_URL: must be a redis://, rediss://, unix:// or redis+sentinel://",
        ),
        ("REDIS_URL", "unix://", "REDIS_URL: names no socket path"),
        ("VERSUS_GATEWAY_PORT", "70000", "VERSUS_GATEWAY_PORT: Input should be less than or equal to 65535"),
        ("VERSUS_LOG_LEVEL", "chatty", "VERSUS_LOG_LEVEL: must be DEBUG, INFO, WARNING or ERROR"),
    ],
)
def test_bad_values_give_one_readable_error(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert message in info.value.message
    assert "\n" not in info.value.message


def test_config_error_never_echoes_a_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "mysql://admin:s3cret-pw@db/versus")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "s3cret-pw" not in str(info.value)


def test_unix_socket_postgres_url_is_accepted() -> None:
    s = load_settings(database_url="postgresql://postgres@/versus?host=/tmp/sock&port=5432")
    assert s.database_url is not None and "host=/tmp/sock" in s.database_url


def test_the_router_pool_keeps_its_connections_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert (s.router_db_pool, s.router_db_overflow) == (40, 0)
    monkeypatch.setenv("VERSUS_ROUTER_DB_POOL", "12")
    monkeypatch.setenv("VERSUS_ROUTER_DB_OVERFLOW", "4")
    s = load_settings()
    assert (s.router_db_pool, s.router_db_overflow) == (12, 4)


@pytest.mark.parametrize(
    ("name", "value"), [("VERSUS_ROUTER_DB_POOL", "0"), ("VERSUS_ROUTER_DB_OVERFLOW", "-1")]
)
def test_a_router_pool_out_of_range_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        load_settings()
