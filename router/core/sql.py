"""Plain SQL on the connection's own psycopg driver, for the router's hot path.

SQLAlchemy stays the pool, the transaction boundary and the home of every
other statement; the statements run for every task (router/dispatch/sql_*.py) skip its
statement building, cache-key walk and result wrapping and go straight to
psycopg, which prepares them server-side after a few executions. Measured on
the development machine: a one-row primary-key read costs 176 µs of CPU through
SQLAlchemy ``text()`` and 62 µs on the driver; a built Core statement with a CTE
costs several times more (docs/benchmarks.md).

The driver connection is the one SQLAlchemy checked out, so a statement run
here is part of the caller's transaction (or autocommits on an autocommit
connection), and ``info`` is the connection's own record: task ids noted there
wake their watchers after the commit (router/core/wakes.py ``TaskWakes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import psycopg
from psycopg import AsyncConnection as PgConnection
from psycopg import AsyncCursor
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncConnection

from common.db.dropped import forget_if_not_primary

# A row as the hot path hands it around: column name to value.
Row: TypeAlias = Mapping[Any, Any]
Params: TypeAlias = Mapping[str, Any] | None


class Sql:
    """One checked-out connection, spoken to in plain SQL (``%(name)s`` placeholders)."""

    __slots__ = ("info", "pg")

    def __init__(self, pg: PgConnection[Any], info: dict[Any, Any]):
        self.pg = pg
        self.info = info

    async def one(self, query: str, params: Params = None) -> dict[str, Any] | None:
        """The first row (as a dict), or None."""
        cur = self.pg.cursor(row_factory=dict_row)
        await self._execute(cur, query, params)
        return await cur.fetchone()

    async def all(self, query: str, params: Params = None) -> list[dict[str, Any]]:
        cur = self.pg.cursor(row_factory=dict_row)
        await self._execute(cur, query, params)
        return await cur.fetchall()

    async def scalar(self, query: str, params: Params = None) -> Any:
        """The first column of the first row, or None when there is no row."""
        cur = self.pg.cursor()
        await self._execute(cur, query, params)
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def run(self, query: str, params: Params = None) -> int:
        """Execute; the number of rows the statement touched."""
        cur = self.pg.cursor()
        await self._execute(cur, query, params)
        return cur.rowcount

    async def _execute(self, cur: AsyncCursor[Any], query: str, params: Params) -> None:
        try:
            await cur.execute(query, params)
        except psycopg.Error as exc:
            # SQLAlchemy never sees these statements, so its error handling cannot retire a
            # connection to a server that stopped taking writes: done here (common/db/dropped.py).
            forget_if_not_primary(self.pg.pgconn, exc)
            raise


Db: TypeAlias = AsyncConnection | Sql


async def sql(conn: Db) -> Sql:
    """The plain-SQL view of a SQLAlchemy connection, in its transaction (begun here if it had none)."""
    if isinstance(conn, Sql):
        return conn
    if not conn.in_transaction():
        # Begun as SQLAlchemy would on its first statement: its commit or rollback events (and on
        # an autocommit connection the closing rollback) are what publish task wake-ups.
        await conn.begin()
    sync = conn.sync_connection
    assert sync is not None
    # The pooled connection is already checked out: no I/O here.
    driver = sync.connection.driver_connection
    assert driver is not None
    return Sql(driver, sync.info)
