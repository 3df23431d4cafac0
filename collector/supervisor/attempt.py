"""One upgrade attempt's download, staging and preflight, on a thread of its own.

The supervising loop never waits on the network: it starts an :class:`Attempt` and goes on
restarting a collector that died and answering signals; it looks at :attr:`Attempt.outcome`
once the thread is done and only then switches versions (which stops the running collector, so
it stays on the loop's thread). :meth:`Attempt.cancel` ends a download at its next chunk, or
shuts the socket of a blocked read down (collector/update_fetcher.py); a thread that still does
not end is left behind (a daemon thread, and it stages nothing half: a release directory
appears by one rename, collector/supervisor/layout.py).

Every exception ends the attempt, never the supervisor: a :class:`UpdateError` keeps its
code, an ``OSError`` or ``ValueError`` while staging is ``install_failed``, anything else is
``update_failed`` with the exception's type.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from collector.supervisor.fetch import Target, UpdateError
from collector.update_fetcher import Cancel
from common.telemetry.logs import get_logger

log = get_logger("versus.collector.supervisor")

PREFLIGHT_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an attempt came to: ``code`` is empty when ``target`` is staged and starts."""

    target: Target
    code: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.code


def classify(exc: BaseException) -> tuple[str, str]:
    """The stable code and the words of an exception that ended an attempt."""
    if isinstance(exc, UpdateError):
        return exc.code, str(exc)
    if isinstance(exc, OSError | ValueError):
        return "install_failed", f"{type(exc).__name__}: {exc}"
    return "update_failed", f"{type(exc).__name__}: {exc}"


def preflight(argv: list[str], env: dict[str, str], version: str, cancelled: Cancel) -> None:
    """Run the staged release's ``--version`` once: a build that cannot even start is refused
    before anything is stopped. Killed when the attempt is cancelled."""
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise UpdateError("release_does_not_start", f"the release did not start: {exc}") from None
    deadline = time.monotonic() + PREFLIGHT_TIMEOUT_S
    try:
        while proc.poll() is None:
            if cancelled.is_set():
                raise UpdateError("update_interrupted", "the supervisor stopped during the preflight")
            if time.monotonic() > deadline:
                raise UpdateError(
                    "release_does_not_start", "`--version` of the release did not finish in time"
                )
            time.sleep(0.1)
        said = proc.stdout.read() if proc.stdout is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if proc.returncode != 0 or version not in said:
        raise UpdateError(
            "release_does_not_start", f"`--version` of the release exited {proc.returncode}: {said[-300:]}"
        )


class Attempt:
    """``work(cancelled)`` on a daemon thread; its outcome once :meth:`done`."""

    def __init__(self, target: Target, work: Callable[[Cancel], None]):
        self.target = target
        self.cancelled = Cancel()
        self.outcome: Outcome | None = None
        self._work = work
        self._thread = threading.Thread(target=self._run, name=f"update-{target.version}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._work(self.cancelled)
            outcome = Outcome(self.target)
        except BaseException as exc:
            code, detail = classify(exc)
            if self.cancelled.is_set():
                code, detail = "update_interrupted", f"the supervisor stopped during the attempt ({detail})"
            outcome = Outcome(self.target, code, detail)
        self.outcome = outcome

    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancel(self, wait_s: float) -> None:
        """Ask the attempt to stop and wait up to ``wait_s`` for it (a blocked read is left behind)."""
        self.cancelled.set()
        self._thread.join(wait_s)
