"""The collector's durable journal (SQLite in the state directory).

Two tables:

* ``received`` - every task id (envelope ``task_id``) accepted, with its
  idempotency key, whether it finished and whether its report was acknowledged;
* ``results`` - idempotency key -> terminal result.

The order of writes is what makes retries safe:

1. receipt is journaled (and committed) **before** execution starts;
2. the result is journaled **before** the report is sent;
3. the report is marked acknowledged only after the gateway confirmed it.

Crash windows and what they yield on restart:

* before (1): the task was never accepted; it is not in the held list, so the
  router sees it was never received and re-routes it;
* between (1) and (2): it may have run partially; it is reported ``unknown``
  (never re-executed here) and the router's ladder decides;
* between (2) and (3): the journaled result is reported again (a duplicate is
  accepted by the router as success);
* a later envelope with a journaled idempotency key is answered from the journal
  (mutations only: reads, reconcile-reads above all, always run, and their
  answers and refusals are journaled under :func:`task_key`, never under the
  idempotency key they share with the mutation).

Retention: acknowledged rows older than 7 days are deleted (the router's
retries of one operation happen within its deadline, at most 7 days).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RETENTION_S = 7 * 86_400

_SCHEMA = """
CREATE TABLE IF NOT EXISTS received (
    task_id TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    provider TEXT NOT NULL,
    received_at REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    reported_at REAL
);
CREATE TABLE IF NOT EXISTS results (
    idempotency_key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    result BLOB NOT NULL,
    error_code TEXT NOT NULL,
    error_message TEXT NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class Result:
    outcome: str
    result: bytes
    error_code: str = ""
    error_message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "result": self.result.hex(), "error_code": self.error_code}


@dataclass(frozen=True, slots=True)
class PendingReport:
    task_id: str
    result: Result


def task_key(task_id: str) -> str:
    """The journal key of a result that belongs to one envelope only (a read, a refusal).

    Results are looked up by idempotency key to answer a retried mutation; a read's answer
    or a refusal must never be such an answer, so they are kept under the envelope's task id.
    """
    return "task:" + task_id


class AlreadyReceived(Exception):
    """The task id is already in the journal (a replay)."""


class Journal:
    def __init__(self, path: Path):
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed receipt survives power loss
        self._db.executescript(_SCHEMA)
        path.chmod(0o600)

    def close(self) -> None:
        self._db.close()

    # --- the verifier's interfaces -------------------------------------------------------------
    def __contains__(self, task_id: object) -> bool:
        row = self._db.execute("SELECT 1 FROM received WHERE task_id = ?", (task_id,)).fetchone()
        return row is not None

    def lookup(self, idempotency_key: str) -> Mapping[str, Any] | None:
        result = self.result(idempotency_key)
        return None if result is None else result.as_dict()

    # --- writes, in order ------------------------------------------------------------------------
    def record_receipt(self, task_id: str, idempotency_key: str, provider: str) -> None:
        try:
            self._db.execute(
                "INSERT INTO received (task_id, idempotency_key, provider, received_at) VALUES (?, ?, ?, ?)",
                (task_id, idempotency_key, provider, time.time()),
            )
        except sqlite3.IntegrityError:
            raise AlreadyReceived(task_id) from None

    def record_result(self, task_id: str, idempotency_key: str, result: Result) -> None:
        """Journal a result (terminal or unknown) for this key, atomically with marking the task finished."""
        with self._transaction():
            self._db.execute(
                "INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(idempotency_key) DO UPDATE SET "
                "task_id=excluded.task_id, outcome=excluded.outcome, result=excluded.result, "
                "error_code=excluded.error_code, error_message=excluded.error_message, "
                "recorded_at=excluded.recorded_at",
                (idempotency_key, task_id, result.outcome, result.result, result.error_code,
                 result.error_message[:4000], time.time()),
            )  # fmt: skip
            self._db.execute("UPDATE received SET finished = 1 WHERE task_id = ?", (task_id,))

    def mark_reported(self, task_id: str) -> None:
        self._db.execute("UPDATE received SET reported_at = ? WHERE task_id = ?", (time.time(), task_id))

    # --- reads -----------------------------------------------------------------------------------
    def result(self, idempotency_key: str) -> Result | None:
        row = self._db.execute(
            "SELECT outcome, result, error_code, error_message FROM results WHERE idempotency_key = ?",
            (idempotency_key,),
        ).fetchone()
        # Only terminal results answer a retry; an unknown outcome must not be replayed as final.
        if row is None or row[0] not in ("success", "failed"):
            return None
        return Result(row[0], bytes(row[1]), row[2], row[3])

    def held_task_ids(self) -> list[str]:
        """Received and not yet acknowledged: what the collector tells the router it holds."""
        rows = self._db.execute("SELECT task_id FROM received WHERE reported_at IS NULL ORDER BY received_at")
        return [r[0] for r in rows]

    def unfinished(self) -> list[tuple[str, str]]:
        """(task_id, idempotency_key) received but never finished: interrupted by a crash."""
        rows = self._db.execute("SELECT task_id, idempotency_key FROM received WHERE finished = 0")
        return [(r[0], r[1]) for r in rows]

    def pending_reports(self) -> list[PendingReport]:
        rows = self._db.execute(
            "SELECT r.task_id, s.outcome, s.result, s.error_code, s.error_message FROM received r "
            "JOIN results s ON s.task_id = r.task_id WHERE r.finished = 1 AND r.reported_at IS NULL"
        )
        return [PendingReport(r[0], Result(r[1], bytes(r[2]), r[3], r[4])) for r in rows]

    def counts(self) -> dict[str, int]:
        received = self._db.execute("SELECT COUNT(*) FROM received").fetchone()[0]
        results = self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return {"received": int(received), "results": int(results), "held": len(self.held_task_ids())}

    def next_claim_seq(self) -> int:
        """Claim numbers survive restarts so a later claim always has a larger number."""
        with self._transaction():
            row = self._db.execute("SELECT value FROM meta WHERE key = 'claim_seq'").fetchone()
            value = int(row[0]) + 1 if row else 1
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('claim_seq', ?)", (str(value),))
        return value

    def prune(self, now: float | None = None) -> int:
        cutoff = (now or time.time()) - RETENTION_S
        with self._transaction():
            cur = self._db.execute(
                "DELETE FROM received WHERE reported_at IS NOT NULL AND reported_at < ?", (cutoff,)
            )
            self._db.execute(
                "DELETE FROM results WHERE recorded_at < ? AND task_id NOT IN (SELECT task_id FROM received)",
                (cutoff,),
            )
        return int(cur.rowcount)

    def _transaction(self) -> _Tx:
        return _Tx(self._db)


class _Tx:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
