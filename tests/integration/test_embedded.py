"""The embedded servers are real, keep their data across restarts and stop cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import redis

from common.embedded.postgres import EmbeddedPostgres
from common.embedded.process import SETPRIV, death_signal_spawn, free_port, pid_alive
from common.embedded.redis import EmbeddedRedis
from common.errors import StartupError

pytestmark = pytest.mark.timeout(120)


def test_postgres_keeps_data_across_restarts(tmp_path: Path) -> None:
    with EmbeddedPostgres(tmp_path / "pg") as pg:
        pid = pg.pid
        with psycopg.connect(pg.url) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('still here')")
    assert pid is not None and not pid_alive(pid)
    with EmbeddedPostgres(tmp_path / "pg") as pg, psycopg.connect(pg.url) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == ("still here",)


def test_postgres_over_tcp_requires_the_generated_password(tmp_path: Path) -> None:
    port = free_port()
    with EmbeddedPostgres(tmp_path / "pg", port=port) as pg:
        assert f"127.0.0.1:{port}" in pg.url
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("versus",)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(f"postgresql://postgres:wrong@127.0.0.1:{port}/versus", connect_timeout=5)


def test_postgres_stops_a_server_left_running_by_a_dead_process(tmp_path: Path) -> None:
    orphan = EmbeddedPostgres(tmp_path / "pg").start()
    # Simulate a supervisor that died without stopping its server: forget the handle.
    leftover, orphan._proc = orphan._proc, None
    assert leftover is not None
    with EmbeddedPostgres(tmp_path / "pg") as pg, psycopg.connect(pg.url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert leftover.poll() is not None


def test_postgres_port_in_use_is_a_startup_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(StartupError, match="embedded PostgreSQL exited during startup"):
            EmbeddedPostgres(tmp_path / "pg", port=port).start()


def test_redis_keeps_data_across_restarts(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "redis") as server:
        pid = server.pid
        client = redis.Redis.from_url(server.url)
        client.set("kept", "yes")
        client.close()
    assert pid is not None and not pid_alive(pid)
    with EmbeddedRedis(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        assert client.get("kept") == b"yes"
        client.close()


def test_redis_over_tcp_requires_the_generated_password(tmp_path: Path) -> None:
    port = free_port()
    with EmbeddedRedis(tmp_path / "redis", port=port) as server:
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.close()
        anonymous = redis.Redis(host="127.0.0.1", port=port)
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        anonymous.close()


def test_postgres_tools_run_as_the_server_user_without_python_in_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """initdb and the other tools switch users through setpriv, as the server itself does: CPython
    cannot vfork a child it must switch users in, so it forks, and a process with live gRPC pollers
    (a test worker, the chaos runner) ran gRPC's at-fork handlers in that child - an initdb failed
    with gRPC's 'epoll_wait error: Bad file descriptor' as its last words (a make test run)."""
    import subprocess

    from common.embedded import process

    calls: list[tuple[list[str], dict[str, object]]] = []
    real_run = subprocess.run

    def recording_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append((list(cmd), kwargs))
        return real_run(cmd, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(subprocess, "run", recording_run)
    server = EmbeddedPostgres(tmp_path / "pg").start()
    try:
        assert calls, "initdb ran"
        for cmd, kwargs in calls:
            assert not {"user", "group", "extra_groups", "preexec_fn"} & set(kwargs), (cmd, kwargs)
            if server._uid_gid() is not None:
                assert process.SETPRIV is not None and cmd[0] == process.SETPRIV, cmd
    finally:
        server.stop()


def test_a_child_spawned_for_a_parent_death_signal_dies_with_its_parent(tmp_path: Path) -> None:
    """The supervisor's services and the test helpers' servers are started this way: through
    setpriv, so no Python runs in the forked child, and still ended when their parent dies."""
    prefix, spawn = death_signal_spawn(signal.SIGTERM)
    assert spawn == {} and prefix[:2] == [str(SETPRIV), "--pdeathsig"]  # Debian always has setpriv
    pid_file = tmp_path / "child.pid"
    # A parent that starts the child the same way, writes its pid, then is killed.
    parent = subprocess.Popen(
        [
            sys.executable, "-c",
            "import subprocess, sys; "
            f"c = subprocess.Popen({[*prefix, 'sleep', '300']!r}); "
            f"open({str(pid_file)!r}, 'w').write(str(c.pid)); "
            "import time; time.sleep(300)",
        ]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the child was not started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert pid_alive(child)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while pid_alive(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
