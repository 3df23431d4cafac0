"""Migrations produce exactly the declared schema, and can be applied repeatedly."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from common.db import migrate
from common.db.engine import create_sync
from common.db.schema import metadata


def _diff(url: str) -> list[object]:
    engine = create_sync(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            return list(compare_metadata(ctx, metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_sync(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_match_declared_models(empty_database_url: str) -> None:
    assert migrate.current_revision(empty_database_url) is None
    assert not migrate.is_current(empty_database_url)
    migrate.upgrade(empty_database_url, "0018")
    assert not migrate.is_current(empty_database_url)  # one migration behind
    migrate.upgrade(empty_database_url)
    assert migrate.is_current(empty_database_url)
    assert _diff(empty_database_url) == []
    assert _tables(empty_database_url) == set(metadata.tables) | {"alembic_version"}


def test_upgrade_is_idempotent_and_downgrade_removes_everything(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    migrate.upgrade(empty_database_url)
    assert migrate.current_revision(empty_database_url) == migrate.head_revision()
    engine = create_sync(empty_database_url)
    try:
        with engine.connect() as conn:
            cfg = migrate.alembic_config(empty_database_url)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
            conn.commit()
    finally:
        engine.dispose()
    assert _tables(empty_database_url) == {"alembic_version"}


def test_an_empty_database_differs_from_the_models(empty_database_url: str) -> None:
    # Guards the comparison itself: without migrations it must report the missing tables.
    assert _diff(empty_database_url) != []
