"""Apply and inspect Alembic migrations programmatically.

``versus-cp migrate`` and ``versus-cp up`` call :func:`upgrade`. Several
processes may start at once against one database; an advisory lock held for
the duration of the upgrade serialises them.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from common.db.engine import create_sync

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary constant shared by every process that migrates this schema.
MIGRATION_LOCK_ID = 0x5645_5253_5553  # "VERSUS"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        cfg.attributes["database_url"] = url
    return cfg


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    return heads[0]


def current_revision(url: str) -> str | None:
    engine = create_sync(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (default: the latest)."""
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
    return current_revision(url) == head_revision()
