"""The schema revision services expect is the migration scripts' one head."""

from __future__ import annotations

from common.db import migrate


def test_the_head_revision_services_check_is_the_newest_migration() -> None:
    assert migrate.head_revision() == migrate.HEAD_REVISION, (
        "a migration was added: set HEAD_REVISION in common/db/migrate.py to its revision"
    )
