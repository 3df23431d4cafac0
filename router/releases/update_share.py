"""The update repository of a control plane on several hosts: every write goes through PostgreSQL.

:class:`SharedUpdateRepository` is router/releases/update_repo.py's repository whose writes
(creating it, following a release key change, re-signing timestamp and snapshot,
publishing, yanking) happen under the writers' lock on a copy brought up to date
first, and are uploaded after (common/updates/repo_sync.py), so two routers never build
on different versions and every gateway serves what any router published.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common.trust.keys import KeySet
from common.updates.repo_sync import SharedDirectory
from router.releases.update_repo import PublishedTarget, UpdateRepository


class SharedUpdateRepository(UpdateRepository):
    def __init__(self, shared: SharedDirectory):
        super().__init__(shared.directory)
        self.shared = shared

    def ensure(self, keys: KeySet, now: dt.datetime) -> None:
        with self.shared.editing():
            super().ensure(keys, now)

    def publish(
        self,
        keys: KeySet,
        artifact: Path,
        name: str,
        custom: Mapping[str, Any],
        now: dt.datetime,
        attachments: Sequence[tuple[Path, str, Mapping[str, Any]]] = (),
    ) -> PublishedTarget:
        with self.shared.editing():
            return super().publish(keys, artifact, name, custom, now, attachments)

    def remove(self, keys: KeySet, name: str, now: dt.datetime, also: Sequence[str] = ()) -> None:
        with self.shared.editing():
            super().remove(keys, name, now, also)
