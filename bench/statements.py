"""SQL statements per task, as PostgreSQL itself saw them.

The embedded server has no ``pg_stat_statements``, so the count comes from the
server's own statement log: for the duration of a counting pass the server logs
every statement (``log_statement = 'all'``) prefixed with the client's
application name, which each service sets (``versus-router``,
``versus-gateway``, ``versus-enrollment``; common/db/engine.py). Logging costs
time, so counting passes are separate from the timed runs. ``BEGIN`` and
``COMMIT`` are round trips too and are counted apart.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from common.db.urls import libpq_url

_LINE = re.compile(r"^(?P<app>versus-[a-z]+)\|LOG:  (?:statement|execute [^:]*): (?P<sql>.*)$")
_TRANSACTION = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK)\b", re.IGNORECASE)


@dataclass
class Counted:
    """Statements per service during a pass (transaction control apart)."""

    statements: Counter[str] = field(default_factory=Counter)
    transaction_control: Counter[str] = field(default_factory=Counter)
    # The statements themselves (the first words of each), to see where they go.
    shapes: Counter[str] = field(default_factory=Counter)

    def per_task(self, tasks: int) -> dict[str, float]:
        out = {app: n / tasks for app, n in sorted(self.statements.items())}
        out["total"] = sum(self.statements.values()) / tasks
        out["begin_commit_total"] = sum(self.transaction_control.values()) / tasks
        return out

    def top(self, tasks: int, n: int = 25) -> list[tuple[str, float]]:
        """The most frequent statements, per task."""
        return [(shape, count / tasks) for shape, count in self.shapes.most_common(n)]


def _configure(url: str, log_all: bool) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        if log_all:
            conn.execute("ALTER SYSTEM SET log_statement = 'all'")
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%a|'")
        else:
            conn.execute("ALTER SYSTEM RESET log_statement")
            conn.execute("ALTER SYSTEM RESET log_line_prefix")
        conn.execute("SELECT pg_reload_conf()")
    # Backends re-read the configuration between commands; give idle ones a moment.
    time.sleep(0.5)


def tally(lines: Iterable[str], counted: Counted) -> None:
    """Add the statements of PostgreSQL log ``lines`` (``log_line_prefix = '%a|'``) to ``counted``.
    A statement spanning several lines is counted once; its shape is its first non-blank line
    (a statement text may start with a line break, its SQL on the continuation lines)."""
    waiting: str | None = None  # the service whose statement's text has not started yet
    for line in lines:
        match = _LINE.match(line.rstrip("\n"))
        if match is None:
            if waiting is not None and line.strip() and not _ANY_PREFIX.match(line):
                _add(counted, waiting, line)
                waiting = None
            continue
        waiting = None
        if not match["sql"].strip():
            waiting = match["app"]
            continue
        _add(counted, match["app"], match["sql"])


_ANY_PREFIX = re.compile(r"^[^\s|]*\|[A-Z]+:  ")


def _add(counted: Counted, app: str, sql: str) -> None:
    control = _TRANSACTION.match(sql) is not None
    (counted.transaction_control if control else counted.statements)[app] += 1
    if not control:
        counted.shapes[f"{app}: {' '.join(sql.split())[:90]}"] += 1


@contextmanager
def counting(database_url: str, log_file: Path) -> Iterator[Counted]:
    """Count the statements each service sends while the block runs."""
    counted = Counted()
    start = log_file.stat().st_size
    _configure(database_url, True)
    try:
        yield counted
    finally:
        _configure(database_url, False)
        with log_file.open("rb") as fh:
            fh.seek(start)
            tally((raw.decode("utf-8", "replace") for raw in fh), counted)
