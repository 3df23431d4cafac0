"""Alembic environment: runs against a connection handed in by common.db.migrate,
or against ``DATABASE_URL`` when invoked through the ``alembic`` command."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy.engine import Connection

from common.db.engine import create_sync
from common.db.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("set DATABASE_URL to run migrations")
    engine = create_sync(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run against a database")
run_migrations_online()
