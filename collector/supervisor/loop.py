"""The supervisor's loop: keep the collector running; install the target the signed config names.

Sequence for a target (docs/upgrades.md), while the running collector keeps working:

1. report ``updating``; download the release through TUF and verify it (fetch.py);
2. stage it in its own directory and run its ``--version`` once (it unpacks, and a build that
   cannot even start is refused before anything is stopped);
3. record the trial, stop the running collector (it drains), switch ``current``, start the new
   version, and give it ``health_window_s`` to answer a claim itself;
4. healthy: report ``updated`` and remove release directories other than these two;
   not healthy: stop it, switch back, start the previous version, report ``rolled_back``.

Steps 1 and 2 run on a thread of their own (attempt.py): the loop goes on restarting a collector
that exits and stops within seconds of a SIGTERM, whatever the download is doing. An attempt
fails, the supervisor never does: every failure is reported (``failed``, with a stable code
first in its detail) and remembered in the state directory (failures.py), so a restarted
supervisor reports it again and waits out its backoff. A broken download is tried again after
``download_retry_s`` (doubling); anything else after ``retry_failed_after_s`` (the control plane
stops targeting it too, until an administrator approves it again). Without ``--manifest-url``
and ``--update-pubkey`` the supervisor only keeps the collector running.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from collector.client import ssl_context
from collector.key_sets import PinnedKeys
from collector.signed_config import ConfigStore
from collector.state import StatePaths, load_key, read_json, write_json
from collector.supervisor import failures
from collector.supervisor.attempt import Attempt, Outcome, preflight
from collector.supervisor.child import STABLE_AFTER_S, Child, backoff, wait_healthy
from collector.supervisor.fetch import (
    ATTEMPT_TIMEOUT_S,
    BOOTSTRAP_TIMEOUT_S,
    ReleaseFetcher,
    Target,
    UpdateError,
)
from collector.supervisor.layout import BUNDLED, Layout
from collector.update_fetcher import Cancel
from common.protocol import update_failure_code
from common.runtime import early_signals
from common.telemetry.logs import get_logger
from common.trust.keys import KeyPurpose
from common.trust.signed_doc import DocumentError

log = get_logger("versus.collector.supervisor")

# How long a stopping supervisor waits for its update attempt to notice the cancel.
CANCEL_WAIT_S = 2.0


@dataclass
class Options:
    state_dir: Path
    install_dir: Path
    manifest_url: str | None = None
    update_pubkey: str | None = None
    health_window_s: float = 120.0
    check_interval_s: float = 5.0
    retry_failed_after_s: float = 3600.0
    download_retry_s: float = 60.0
    update_timeout_s: float = ATTEMPT_TIMEOUT_S
    bootstrap_timeout_s: float = BOOTSTRAP_TIMEOUT_S
    run_args: list[str] = field(default_factory=list)

    @property
    def updates_enabled(self) -> bool:
        return bool(self.manifest_url and self.update_pubkey)


class Supervisor:
    def __init__(self, options: Options):
        self.options = options
        self.paths = StatePaths(options.state_dir)
        self.layout = Layout(options.install_dir)
        self.layout.prepare()
        self.stop_requested = False
        self.retry = failures.RetryPolicy(options.download_retry_s, options.retry_failed_after_s)
        self.failures_path = options.state_dir / "update-failures.json"
        self.failed = failures.load(self.failures_path)
        self.child: Child | None = None
        self.attempt: Attempt | None = None

    # --- process ---------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True

    def _start(self, version: str) -> Child:
        argv, env = self.layout.command(version, ["run", "--state-dir", str(self.options.state_dir),
                                                  *self.options.run_args])  # fmt: skip
        return Child(argv, env, self.layout.version_name(version))

    def _stopping(self) -> bool:
        return self.stop_requested

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stop_requested and time.monotonic() < end:
            time.sleep(min(0.25, max(end - time.monotonic(), 0)))

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        # A stop that came while the process started (collector/entry.py) is honoured now.
        early_signals.imported()
        if early_signals.requested() is not None:
            self.stop_requested = True
        if self.stop_requested:
            log.info("supervisor stopped before it started the collector")
            return 0
        self._recover()
        log.info("supervisor started", running=self.layout.version_name(self.layout.current()),
                 updates=self.options.updates_enabled)  # fmt: skip
        restarts = 0
        self.child = self._start(self.layout.current())
        next_check = time.monotonic()
        while not self.stop_requested:
            code = self.child.exited()
            if code is not None:
                restarts = 0 if time.time() - self.child.started > STABLE_AFTER_S else restarts + 1
                delay = backoff(restarts)
                log.warning("collector exited; restarting", status=code, in_s=delay)
                self._sleep(delay)
                if self._stopping():
                    break
                self.child = self._start(self.layout.current())
                continue
            if self.attempt is not None and self.attempt.done():
                self._finish(self.attempt.outcome)
            elif self.attempt is None and self.options.updates_enabled and time.monotonic() >= next_check:
                self._check_update()
                next_check = time.monotonic() + self.options.check_interval_s
            self._sleep(0.25)
        if self.attempt is not None:
            self.attempt.cancel(CANCEL_WAIT_S)
            self._finish(self.attempt.outcome, swap=False)
        self.child.stop()
        log.info("supervisor stopped")
        return 0

    # --- upgrades --------------------------------------------------------------------------------
    def _report(self, state: str, version: str, detail: str = "") -> None:
        """What the collector passes on with its claims (router/releases/updates.py records it)."""
        write_json(self.paths.update_status, {"state": state, "version": version, "detail": detail[:500],
                                              "at": int(time.time())})  # fmt: skip
        log.info("update " + state.replace("_", " "), version=version, detail=detail)

    def _target(self) -> Target | None:
        """The target the signed config names, verified with the pinned dispatch keys."""
        if not self.paths.config.exists():
            return None
        try:
            identity = read_json(self.paths.identity)
            config = ConfigStore(
                self.paths.config, identity["collector_id"], PinnedKeys(self.paths.keys).dispatch
            )
        except (DocumentError, OSError, ValueError, KeyError) as exc:
            log.warning("the signed config cannot be read; no upgrade", reason=str(exc))
            return None
        update = (config.current or {}).get("update")
        return Target.from_config(update) if isinstance(update, dict) else None

    def _fetcher(self, cancelled: Cancel) -> ReleaseFetcher:
        identity = read_json(self.paths.identity)
        pinned = PinnedKeys(self.paths.keys).sets[KeyPurpose.RELEASE].keys
        return ReleaseFetcher(
            self.options.state_dir / "tuf", str(self.options.manifest_url), self.layout.downloads,
            ssl_context(self.paths), load_key(self.paths.key), identity["collector_id"], pinned,
            str(self.options.update_pubkey), timeout_s=self.options.update_timeout_s,
            bootstrap_timeout_s=self.options.bootstrap_timeout_s, cancelled=cancelled,
        )  # fmt: skip

    def _prepare(self, target: Target, cancelled: Cancel) -> None:
        """On the attempt's thread: download and verify, stage, start ``--version`` once."""
        fetcher = self._fetcher(cancelled)
        try:
            artifact = fetcher.fetch(target)
        finally:
            fetcher.close()
        if cancelled.is_set():
            raise UpdateError("update_interrupted", "the supervisor stopped during the attempt")
        self.layout.stage(target.version, artifact)
        argv, env = self.layout.command(target.version, ["--version"])
        preflight(argv, {**os.environ, **env}, target.version, cancelled)

    def _check_update(self) -> None:
        try:
            target = self._target()
        except UpdateError as exc:
            log.warning("upgrade target refused", code=exc.code, reason=str(exc))
            return
        running = self.layout.current()
        if target is None or target.version == self.layout.version_name(running):
            return
        failure = self.failed.get(target.version)
        if not self.retry.may_retry(failure, time.time()):
            assert failure is not None
            self._report_remembered(failure)
            return
        self._report("updating", target.version)
        self.attempt = Attempt(target, lambda cancelled: self._prepare(target, cancelled))

    def _finish(self, outcome: Outcome | None, *, swap: bool = True) -> None:
        """The attempt's thread is done (or abandoned, ``outcome`` None): report it, or switch."""
        attempt, self.attempt = self.attempt, None
        if outcome is None:
            assert attempt is not None
            outcome = Outcome(
                attempt.target, "update_interrupted", "the supervisor stopped during the download"
            )
        if not outcome.ok:
            self._failed(outcome.target.version, f"{outcome.code}: {outcome.detail}", "failed")
        elif swap:
            self._swap(outcome.target.version, self.layout.current())
        else:  # staged, but the supervisor is stopping: the next one starts from the check again
            why = "update_interrupted: the supervisor stopped before the switch"
            self._failed(outcome.target.version, why, "failed")

    def _swap(self, version: str, previous: str) -> None:
        assert self.child is not None
        self.layout.begin_trial(version, previous)
        self.child.stop()
        self.layout.switch(version)
        self.child = self._start(version)
        why = wait_healthy(
            self.paths.runtime, self.child, self.options.health_window_s, lambda: self.stop_requested
        )
        if why is None:
            self.layout.end_trial()
            self._forget(version)
            self._report("updated", version)
            self.layout.prune({version, previous} - {BUNDLED})
            return
        log.error("the new version failed its health window; rolling back", version=version, reason=why)
        self.child.stop()
        self.layout.switch(previous)
        self.layout.end_trial()
        self._failed(version, f"release_unhealthy: {why}", "rolled_back")
        if not self.stop_requested:
            self.child = self._start(previous)

    def _failed(self, version: str, detail: str, state: str) -> None:
        self.failed = failures.recorded(
            self.failed, version, update_failure_code(detail), detail, time.time()
        )
        try:
            failures.save(self.failures_path, self.failed)
        except OSError as exc:  # the report below still goes out; the memory is this process's only
            log.warning("the update failure could not be remembered", reason=str(exc))
        self._report(state, version, detail)

    def _forget(self, version: str) -> None:
        if self.failed.pop(version, None) is not None:
            failures.save(self.failures_path, self.failed)

    def _report_remembered(self, failure: failures.Failure) -> None:
        """A failure still in its backoff is what the control plane hears, not a stale ``updating``."""
        try:
            status = read_json(self.paths.update_status)
        except (OSError, ValueError):
            status = {}
        if status.get("version") != failure.version or status.get("state") not in ("failed", "rolled_back"):
            self._report("failed", failure.version, failure.detail)

    def _recover(self) -> None:
        """A trial left by a supervisor that stopped during a health window is rolled back; an
        attempt a supervisor did not live to finish is reported as interrupted."""
        trial = self.layout.trial()
        if trial is not None:
            self.layout.switch(trial.previous)
            self.layout.end_trial()
            self._failed(trial.version, "release_unhealthy: the supervisor stopped during the health window",
                         "rolled_back")  # fmt: skip
            return
        try:
            status = read_json(self.paths.update_status)
        except (OSError, ValueError):
            return
        if isinstance(status, dict) and status.get("state") == "updating" and status.get("version"):
            why = "update_interrupted: the supervisor stopped during the attempt"
            self._failed(str(status["version"]), why, "failed")
