"""Which upgrades failed, when, and when each may be tried again - kept in the state directory.

A failed attempt is remembered in ``<state>/update-failures.json`` (written atomically), so a
supervisor restarted by systemd, or by a crash, reports the failure again and waits out the same
backoff instead of trying at once: a version that breaks a supervisor can never turn
``Restart=always`` into a loop of attempts.

How long a version waits depends on what failed:

* **a transient failure** (:data:`common.protocol.RETRYABLE_UPDATE_FAILURES`: the download broke,
  the attempt ran out of time or was interrupted) is tried again after ``download_retry_s``,
  doubled with each failure in a row, at most ``retry_failed_after_s``: a gateway restart
  during a download costs a minute, not an hour;
* **anything else** (refused metadata, a release that does not start or fails its health window)
  waits ``retry_failed_after_s`` (an hour by default; the control plane stops targeting it too).

Pure apart from :func:`load` and :func:`save`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from common.config.state_dir import write_public
from common.protocol import RETRYABLE_UPDATE_FAILURES

# At most this many versions are remembered (the newest failures): the file stays small.
MAX_REMEMBERED = 16


@dataclass(frozen=True, slots=True)
class Failure:
    """One version's last failure: ``code`` as reported, ``at`` wall-clock seconds, ``count`` in a row."""

    version: str
    code: str
    detail: str
    at: float
    count: int = 1

    @property
    def transient(self) -> bool:
        return self.code in RETRYABLE_UPDATE_FAILURES


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    download_retry_s: float = 60.0
    retry_failed_after_s: float = 3600.0

    def wait_s(self, failure: Failure) -> float:
        """How long after ``failure`` its version may be tried again."""
        if not failure.transient:
            return self.retry_failed_after_s
        return min(self.retry_failed_after_s, self.download_retry_s * (1 << min(failure.count - 1, 16)))

    def may_retry(self, failure: Failure | None, now: float) -> bool:
        # A clock that went back by more than the wait does not hold a version off forever.
        return failure is None or not (failure.at <= now < failure.at + self.wait_s(failure))


def recorded(
    failures: dict[str, Failure], version: str, code: str, detail: str, now: float
) -> dict[str, Failure]:
    """``failures`` with a new failure of ``version``: ``count`` grows while the code stays transient."""
    before = failures.get(version)
    count = (
        before.count + 1
        if before is not None and before.transient and code in RETRYABLE_UPDATE_FAILURES
        else 1
    )
    updated = {**failures, version: Failure(version, code, detail, now, count)}
    newest = sorted(updated.values(), key=lambda f: f.at, reverse=True)[:MAX_REMEMBERED]
    return {f.version: f for f in newest}


def load(path: Path) -> dict[str, Failure]:
    """The remembered failures; an unreadable file is treated as none (it is rewritten on the next)."""
    try:
        raw = json.loads(path.read_text())
        return {
            str(v["version"]): Failure(
                str(v["version"]), str(v["code"]), str(v["detail"]), float(v["at"]), int(v["count"])
            )
            for v in raw["failures"]
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save(path: Path, failures: dict[str, Failure]) -> None:
    document = {"failures": [asdict(f) for f in sorted(failures.values(), key=lambda f: f.version)]}
    write_public(path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())
