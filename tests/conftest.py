"""Fixtures giving tests real, isolated PostgreSQL databases and Redis databases.

By default the servers are embedded ones started once per session under a
temporary directory; set ``TEST_DATABASE_URL`` / ``TEST_REDIS_URL`` to use
external servers instead. Each test gets its own database cloned from a
migrated template, and its own flushed Redis logical database.
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from hypothesis import settings

from common.db.migrate import upgrade
from common.embedded.postgres import EmbeddedPostgres
from common.embedded.process import use_port_range
from common.embedded.redis import DATABASES, EmbeddedRedis
from tests.support.ports import claim_range
from tests.support.urls import with_database, with_redis_db

# Property tests explore the same examples on every run, so a green main stays green;
# HYPOTHESIS_PROFILE=explore draws new random examples (and keeps any failure it finds in .hypothesis/).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

ROOT = Path(__file__).resolve().parent
# Fixtures shared by modules that opt in (usefixtures): the log-capturing credential check.
pytest_plugins = ["tests.support.logs", "tests.support.cpu"]


def pytest_configure(config: pytest.Config) -> None:
    # Parallel workers (pytest-xdist) pick ports from ranges of their own below the kernel's
    # ephemeral range (32768 and up by default), so no two processes are handed the same port;
    # each claims a range no other worker of any pytest session holds (tests/support/ports.py).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        claimed = claim_range(ephemeral_low)
        if claimed is not None:
            use_port_range(*claimed)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist schedules by node id: tests sharing one would silently not run. Fail loudly instead.
        seen = collections.Counter(item.nodeid for item in items)
        shared = sorted(nodeid for nodeid, n in seen.items() if n > 1)
        if shared:
            message = f"tests share node ids, which xdist cannot run apart: {shared}"
            # xdist shows a worker's collection error only as an INTERNALERROR: say why first.
            print(message, file=sys.__stderr__)
            raise pytest.UsageError(message)
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if ROOT / "integration" in path.parents:
            item.add_marker(pytest.mark.integration)
        elif ROOT / "e2e" in path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a database on the test PostgreSQL server with rights to create databases."""
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield external
        return
    server = EmbeddedPostgres(tmp_path_factory.mktemp("postgres")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_database(postgres_url: str) -> Iterator[str]:
    """A migrated database that per-test databases are cloned from."""
    name = f"versus_template_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    upgrade(with_database(postgres_url, name))
    try:
        yield name
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _create_database(admin_url: str, template: str | None) -> str:
    name = f"test_{uuid.uuid4().hex[:12]}"
    clause = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{clause}')
    return name


def _drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(postgres_url: str, template_database: str) -> Iterator[str]:
    """A fresh, migrated database for this test only."""
    name = _create_database(postgres_url, template_database)
    try:
        yield with_database(postgres_url, name)
    finally:
        _drop_database(postgres_url, name)


@pytest.fixture
def empty_database_url(postgres_url: str) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = _create_database(postgres_url, None)
    try:
        yield with_database(postgres_url, name)
    finally:
        _drop_database(postgres_url, name)


@pytest.fixture(scope="session")
def redis_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("TEST_REDIS_URL")
    if external:
        yield external
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _redis_dbs() -> Iterator[int]:
    count = int(
        os.environ.get("TEST_REDIS_DATABASES", "16" if os.environ.get("TEST_REDIS_URL") else DATABASES)
    )
    # Database 0 is left alone so a shared external server's default db is untouched.
    return itertools.cycle(range(1, count))


@pytest.fixture
def redis_url(redis_server_url: str, _redis_dbs: Iterator[int]) -> Iterator[str]:
    """A flushed Redis logical database for this test only."""
    url = with_redis_db(redis_server_url, next(_redis_dbs))
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
        yield url
        client.flushdb()
    finally:
        client.close()
