"""PostgreSQL URLs: a Patroni cluster's libpq multi-host URL reaches SQLAlchemy as its host list."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from common.config.settings import Settings
from common.db.engine import describe
from common.db.urls import hosts, sqlalchemy_url

MULTI = "postgresql://versus:p%40ss@10.0.1.21:5432,10.0.1.22:5433/versus?target_session_attrs=read-write"


def test_a_multi_host_url_becomes_psycopgs_host_and_port_lists() -> None:
    url = make_url(sqlalchemy_url(MULTI))
    _, kwargs = PGDialect_psycopg().create_connect_args(url)  # type: ignore[no-untyped-call]
    assert kwargs["host"] == "10.0.1.21,10.0.1.22" and kwargs["port"] == "5432,5433"
    assert kwargs["target_session_attrs"] == "read-write" and kwargs["password"] == "p@ss"
    assert kwargs["dbname"] == "versus" and kwargs["user"] == "versus"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (MULTI, ["10.0.1.21:5432", "10.0.1.22:5433"]),
        ("postgresql://u@db.example:6432/versus", ["db.example:6432"]),
        ("postgresql://u@/versus?host=/run/pg&port=5432", ["/run/pg"]),
        ("postgresql://u@/versus?host=a:1&host=b:2", ["a:1", "b:2"]),
        ("postgresql:///versus", ["localhost"]),
    ],
)
def test_hosts_are_listed_in_the_order_libpq_tries_them(url: str, expected: list[str]) -> None:
    assert hosts(url) == expected


def test_a_single_host_url_is_left_as_written() -> None:
    assert (
        sqlalchemy_url("postgres://u:p@h:1/d?sslmode=require")
        == "postgresql+psycopg://u:p@h:1/d?sslmode=require"
    )


def test_describe_names_every_host_and_never_the_password() -> None:
    assert describe(MULTI) == "10.0.1.21:5432,10.0.1.22:5433/versus"


@pytest.mark.parametrize("url", [MULTI, "postgresql://u@h,g/d", "postgresql://u@/d?host=/run/pg"])
def test_settings_accept_multi_host_urls(url: str) -> None:
    assert Settings(database_url=url).database_url == url


@pytest.mark.parametrize(
    "url", ["postgresql://u@h:5,g:x/d", "postgresql://u@h:99999/d", "postgresql://u@h:0,g:1/d"]
)
def test_settings_refuse_a_bad_port_on_any_host(url: str) -> None:
    with pytest.raises(ValueError, match="invalid port"):
        Settings(database_url=url)
