"""`versus-cp migrate`: bring the database schema to the latest revision."""

from __future__ import annotations

from common.config.settings import Settings
from common.config.state_dir import StateLock, ensure_writable
from common.db import engine as db_engine
from common.db import migrate as db_migrate
from common.embedded.postgres import EmbeddedPostgres
from common.errors import StartupError, Unavailable
from common.runtime.service import setup_logging
from common.telemetry.logs import get_logger

log = get_logger("versus.migrate")


def apply(database_url: str) -> None:
    """Check the database answers, then upgrade it to head."""
    try:
        db_engine.check_reachable(database_url)
    except Unavailable as exc:
        raise StartupError(exc.message) from None
    before = db_migrate.current_revision(database_url)
    db_migrate.upgrade(database_url)
    log.info(
        "schema is current",
        database=db_engine.describe(database_url),
        revision=db_migrate.head_revision(),
        previous=before or "empty",
    )


def migrate(settings: Settings) -> None:
    """Migrate ``DATABASE_URL``, or the embedded server under the state directory."""
    setup_logging(settings, "migrate")
    if settings.database_url:
        apply(settings.database_url)
        return
    state = ensure_writable(settings.state_dir)
    lock = StateLock(state)
    lock.acquire()
    try:
        with EmbeddedPostgres(state / "postgres") as pg:
            apply(pg.url)
    finally:
        lock.release()
