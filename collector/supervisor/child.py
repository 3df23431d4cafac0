"""The collector process the supervisor runs: start, stop, health window, restart backoff."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from collector.state import SUPERVISED_ENV
from common.telemetry.logs import get_logger

log = get_logger("versus.collector.supervisor")

# The collector drains in-flight work for its grace period (30 s by default) after SIGTERM.
STOP_TIMEOUT_S = 45.0
BACKOFF_CAP_S = 60.0
# A child that ran this long without exiting resets the restart backoff.
STABLE_AFTER_S = 60.0


class Child:
    """One collector process."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], version: str):
        self.version = version
        self.started = time.time()
        environment = {**os.environ, **env, SUPERVISED_ENV: "1"}
        self.process = subprocess.Popen(list(argv), env=environment)
        log.info("collector started", version=version, pid=self.process.pid)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> int | None:
        return self.process.poll()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (the collector drains), then SIGKILL after ``timeout_s``."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("collector did not stop in time; killing it", pid=self.pid)
            self.process.kill()
            self.process.wait()


def healthy(runtime: Path, child: Child) -> bool:
    """The child answered a claim itself: the control plane accepted its session."""
    try:
        seen = json.loads(runtime.read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(seen, dict)
        and seen.get("pid") == child.pid
        and isinstance(seen.get("last_claim_at"), int | float)
        and seen["last_claim_at"] >= child.started
    )


def wait_healthy(
    runtime: Path, child: Child, window_s: float, stopping: Callable[[], bool], poll_s: float = 0.5
) -> str | None:
    """Wait up to ``window_s`` for the child's first answered claim; None when healthy, else why not."""
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        if healthy(runtime, child):
            return None
        code = child.exited()
        if code is not None:
            return f"the new version exited with status {code} before it reached the control plane"
        if stopping():
            return "the supervisor was asked to stop during the health window"
        time.sleep(poll_s)
    return f"the new version did not reach the control plane within {window_s:.0f} s"


def backoff(attempt: int) -> float:
    return float(min(BACKOFF_CAP_S, 2 ** max(attempt, 0)))
