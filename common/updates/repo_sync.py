"""The collector update repository shared through PostgreSQL, for control planes on several hosts.

On one host the TUF repository is a directory (router/releases/update_repo.py) that the
router writes and the gateway serves. With replicas on several hosts
(``VERSUS_KEY_MATERIAL=shared``, docs/deployment.md) every router may publish and
every gateway must serve the same files, so the directory is mirrored in
PostgreSQL (``update_files``): each writer takes an advisory lock, brings its
directory up to the newest files, changes it, and uploads what changed; every
host follows new revisions within :data:`FOLLOW_INTERVAL_S`. Files are written
atomically in an order a client can follow: artifacts first, then metadata,
``timestamp.json`` last (what a TUF client reads first names only what is there).
Every file is checked against its SHA-256 before it is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection, Engine

from common.config.state_dir import file_sha256, write_public
from common.db.schema import update_file_chunks, update_files
from common.errors import ConfigError
from common.telemetry.logs import get_logger

log = get_logger("versus.updates.sync")

FOLLOW_INTERVAL_S = 5.0
CHUNK_BYTES = 1 << 20
SYNCED = ".synced.json"  # path -> sha256 of what this copy last pulled or pushed
TREES = ("targets", "metadata")
# pg_advisory_xact_lock key of the repository's writers (any fixed number shared by all hosts).
LOCK_KEY = 0x76657273757370  # "versusp"


def _newest(conn: Connection) -> int:
    return int(conn.execute(select(func.coalesce(func.max(update_files.c.revision), 0))).scalar_one())


def _order(path: str) -> tuple[int, str]:
    """Artifacts, then metadata, then the timestamp (what clients read first comes last)."""
    if path.startswith("targets/"):
        return (0, path)
    return (2, path) if path.endswith("timestamp.json") else (1, path)


class SharedDirectory:
    """One host's copy of the repository directory, kept equal to PostgreSQL's."""

    def __init__(self, directory: Path, engine: Engine):
        self.directory = directory
        self.engine = engine
        self.revision = 0

    def _synced(self) -> dict[str, str]:
        try:
            value: dict[str, str] = json.loads((self.directory / SYNCED).read_text())
            return value
        except (OSError, ValueError):
            return {}

    def _local(self) -> dict[str, str]:
        found = {}
        for tree in TREES:
            root = self.directory / tree
            if root.is_dir():
                for path in root.iterdir():
                    if path.is_file() and not path.name.startswith(".") and not path.name.endswith(".part"):
                        found[path.relative_to(self.directory).as_posix()] = file_sha256(path)
        return found

    def pull(self, conn: Connection) -> int:
        """Write every file PostgreSQL has newer than this copy; how many were written."""
        synced = self._synced()
        rows = conn.execute(select(update_files.c.path, update_files.c.sha256, update_files.c.revision)).all()
        wanted = sorted((r for r in rows if synced.get(r.path) != r.sha256), key=lambda r: _order(r.path))
        for row in wanted:
            path = self.directory / row.path
            if path.is_file() and file_sha256(path) == row.sha256:
                synced[row.path] = row.sha256
                continue
            chunks = conn.execute(
                select(update_file_chunks.c.data)
                .where(update_file_chunks.c.path == row.path)
                .order_by(update_file_chunks.c.n)
            ).scalars()
            data = b"".join(bytes(c) for c in chunks)
            if hashlib.sha256(data).hexdigest() != row.sha256:
                raise ConfigError(f"update file {row.path} in PostgreSQL does not match its SHA-256")
            write_public(path, data)
            synced[row.path] = row.sha256
        self.revision = max((r.revision for r in rows), default=0)
        if wanted:
            write_public(self.directory / SYNCED, json.dumps(synced).encode())
        return len(wanted)

    def push(self, conn: Connection) -> int:
        """Upload every file of this copy that PostgreSQL does not have as it is; how many."""
        synced = self._synced()
        changed = {p: h for p, h in self._local().items() if synced.get(p) != h}
        if not changed:
            return 0
        revision = (
            int(conn.execute(select(func.coalesce(func.max(update_files.c.revision), 0))).scalar_one()) + 1
        )
        for rel, digest in sorted(changed.items(), key=lambda item: _order(item[0])):
            path = self.directory / rel
            conn.execute(
                pg_insert(update_files)
                .values(path=rel, sha256=digest, size=path.stat().st_size, revision=revision)
                .on_conflict_do_update(
                    index_elements=["path"],
                    set_={
                        "sha256": digest,
                        "size": path.stat().st_size,
                        "revision": revision,
                        "updated_at": func.now(),
                    },
                )
            )
            conn.execute(delete(update_file_chunks).where(update_file_chunks.c.path == rel))
            with path.open("rb") as fh:
                for n, block in enumerate(iter(lambda: fh.read(CHUNK_BYTES), b"")):
                    conn.execute(insert(update_file_chunks).values(path=rel, n=n, data=block))
            synced[rel] = digest
        write_public(self.directory / SYNCED, json.dumps(synced).encode())
        self.revision = revision
        return len(changed)

    @contextlib.contextmanager
    def editing(self) -> Iterator[Path]:
        """The directory to change, up to date under the writers' lock; what changed is uploaded
        when the block ends (nothing if it raises)."""
        with self.engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
            self.pull(conn)
            yield self.directory
            pushed = self.push(conn)
        if pushed:
            log.info("update repository stored", files=pushed, revision=self.revision)

    def check(self) -> bool:
        """Pull when PostgreSQL has a newer revision than this copy; whether it did."""
        with self.engine.connect() as conn:
            newest = int(
                conn.execute(select(func.coalesce(func.max(update_files.c.revision), 0))).scalar_one()
            )
            if newest <= self.revision:
                return False
            return self.pull(conn) > 0

    async def follow(self, stop: asyncio.Event, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Until ``stop``: keep this copy up to date (errors keep the files it has)."""
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.check)
            except Exception:
                log.warning("following the update repository failed; retrying", exc_info=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await stop.wait()
