"""The supervisor's loop: keep the collector running; install the target the signed config names.

Sequence for a target (docs/upgrades.md), while the running collector keeps working:

1. report ``updating``; download the release through TUF and verify it (fetch.py);
2. stage it in its own directory and run its ``--version`` once (it unpacks, and a build that
   cannot even start is refused before anything is stopped);
3. record the trial, stop the running collector (it drains), switch ``current``, start the new
   version, and give it ``health_window_s`` to answer a claim itself;
4. healthy: report ``updated`` and remove release directories other than these two;
   not healthy: stop it, switch back, start the previous version, report ``rolled_back``.

A version that failed is not tried again for ``retry_failed_after_s`` (the control plane stops
targeting it too, until an administrator approves it again). Without ``--manifest-url`` and
``--update-pubkey`` the supervisor only keeps the collector running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from collector.client import ssl_context
from collector.key_sets import PinnedKeys
from collector.signed_config import ConfigStore
from collector.state import StatePaths, load_key, read_json, write_json
from collector.supervisor.child import STABLE_AFTER_S, Child, backoff, wait_healthy
from collector.supervisor.fetch import ReleaseFetcher, Target, UpdateError
from collector.supervisor.layout import BUNDLED, Layout
from common.telemetry.logs import get_logger
from common.trust.keys import KeyPurpose
from common.trust.signed_doc import DocumentError

log = get_logger("versus.collector.supervisor")

PREFLIGHT_TIMEOUT_S = 300.0


@dataclass
class Options:
    state_dir: Path
    install_dir: Path
    manifest_url: str | None = None
    update_pubkey: str | None = None
    health_window_s: float = 120.0
    check_interval_s: float = 5.0
    retry_failed_after_s: float = 3600.0
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
        self.failed: dict[str, float] = {}
        self.child: Child | None = None

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
        self._recover()
        log.info("supervisor started", running=self.layout.version_name(self.layout.current()),
                 updates=self.options.updates_enabled)  # fmt: skip
        attempt = 0
        self.child = self._start(self.layout.current())
        next_check = time.monotonic()
        while not self.stop_requested:
            code = self.child.exited()
            if code is not None:
                attempt = 0 if time.time() - self.child.started > STABLE_AFTER_S else attempt + 1
                delay = backoff(attempt)
                log.warning("collector exited; restarting", status=code, in_s=delay)
                self._sleep(delay)
                if self._stopping():
                    break
                self.child = self._start(self.layout.current())
                continue
            if self.options.updates_enabled and time.monotonic() >= next_check:
                self._check_update()
                next_check = time.monotonic() + self.options.check_interval_s
            self._sleep(0.5)
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

    def _fetcher(self) -> ReleaseFetcher:
        identity = read_json(self.paths.identity)
        pinned = PinnedKeys(self.paths.keys).sets[KeyPurpose.RELEASE].keys
        return ReleaseFetcher(
            self.options.state_dir / "tuf", str(self.options.manifest_url), self.layout.downloads,
            ssl_context(self.paths), load_key(self.paths.key), identity["collector_id"], pinned,
            str(self.options.update_pubkey),
        )  # fmt: skip

    def _preflight(self, version: str) -> None:
        argv, env = self.layout.command(version, ["--version"])
        try:
            done = subprocess.run(
                argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=PREFLIGHT_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UpdateError("release_does_not_start", f"the release did not start: {exc}") from None
        if done.returncode != 0 or version not in done.stdout:
            raise UpdateError(
                "release_does_not_start",
                f"`--version` of the release exited {done.returncode}: {(done.stdout + done.stderr)[-300:]}",
            )

    def _check_update(self) -> None:
        try:
            target = self._target()
        except UpdateError as exc:
            log.warning("upgrade target refused", code=exc.code, reason=str(exc))
            return
        running = self.layout.current()
        if target is None or target.version == self.layout.version_name(running):
            return
        failed_at = self.failed.get(target.version)
        if failed_at is not None and time.time() - failed_at < self.options.retry_failed_after_s:
            return
        self._report("updating", target.version)
        fetcher = None
        try:
            fetcher = self._fetcher()
            artifact = fetcher.fetch(target)
            self.layout.stage(target.version, artifact)
            self._preflight(target.version)
        except UpdateError as exc:
            self._failed(target.version, f"{exc.code}: {exc}", "failed")
            return
        except (OSError, ValueError) as exc:
            self._failed(target.version, f"install_failed: {exc}", "failed")
            return
        finally:
            if fetcher is not None:
                fetcher.close()
        self._swap(target.version, running)

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
            self._report("updated", version)
            self.layout.prune({version, previous} - {BUNDLED})
            return
        log.error("the new version failed its health window; rolling back", version=version, reason=why)
        self.child.stop()
        self.layout.switch(previous)
        self.layout.end_trial()
        self._failed(version, why, "rolled_back")
        if not self.stop_requested:
            self.child = self._start(previous)

    def _failed(self, version: str, detail: str, state: str) -> None:
        self.failed[version] = time.time()
        self._report(state, version, detail)

    def _recover(self) -> None:
        """A trial left by a supervisor that stopped during a health window is rolled back."""
        trial = self.layout.trial()
        if trial is None:
            return
        self.layout.switch(trial.previous)
        self.layout.end_trial()
        self._failed(trial.version, "the supervisor stopped during the health window", "rolled_back")
