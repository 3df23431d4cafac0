"""Apply and inspect Alembic migrations programmatically.

``versus-cp migrate`` and ``versus-cp up`` call :func:`upgrade`. Several
processes may start at once against one database; an advisory lock held for
the duration of the upgrade serialises them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from sqlalchemy import text

from common.db.engine import CONNECT_TIMEOUT_S, create_sync
from common.db.urls import libpq_url

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary constant shared by every process that migrates this schema.
MIGRATION_LOCK_ID = 0x5645_5253_5553  # "VERSUS"
# The newest migration's revision. Every service checks the database against it at startup; read
# from here, that check loads neither Alembic nor the migration scripts (0.1-0.3 s of CPU per
# process). tests/unit/test_schema_head.py keeps it equal to the scripts' one head.
HEAD_REVISION = "0022"


def alembic_config(url: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        cfg.attributes["database_url"] = url
    return cfg


def head_revision() -> str:
    """The one head of the migration scripts, as Alembic reads them."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    return heads[0]


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = create_sync(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (default: the latest)."""
    from alembic import command

    engine = create_sync(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            try:
                cfg = alembic_config(url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
                conn.commit()
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
                conn.commit()
    finally:
        engine.dispose()


def is_current(url: str) -> bool:
    """Whether the database is at :data:`HEAD_REVISION` (one query; no Alembic, no pool)."""
    with psycopg.connect(libpq_url(url), connect_timeout=CONNECT_TIMEOUT_S) as conn:
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except psycopg.errors.UndefinedTable:
            return False
    return row is not None and row[0] == HEAD_REVISION
