"""The collector's running state, shared by its claim loop, execution and reporting layers:
options, identity, journal, drivers, vault mode and the background tasks (collector/agent.py
puts the layers together)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.client import GatewayClient, ssl_context
from collector.credentials import Credentials, LocalCredentials, no_credentials
from collector.drivers import registry
from collector.drivers.base import Driver, DriverContext
from collector.journal import Journal
from collector.key_sets import PinnedKeys
from collector.renewal import Renewer
from collector.running import RunningTasks
from collector.signed_config import ConfigStore, OfferCheck
from collector.state import StatePaths, load_key, read_json
from collector.trust import TrustStore
from collector.vault_settings import SECRET_FILE, VaultError, VaultSettings
from common.envelope.verify import ServerClock
from common.telemetry.logs import get_logger

if TYPE_CHECKING:
    from collector.external_vault import ExternalVault
from common.trust.signed_doc import DocumentError


@dataclass(frozen=True)
class RunOptions:
    state_dir: Path
    claim_wait_s: float = 25.0
    # An idle collector's claim on the control socket: the socket's pings are its heartbeat there.
    socket_claim_wait_s: float = 120.0
    grace_s: float = 30.0
    max_backoff_s: float = 60.0
    ws_retry_s: float = 60.0
    drivers: tuple[str, ...] | None = None
    # A loopback /metrics for the host's own agent (collector/local_metrics.py); 0: none.
    metrics_port: int = 0


class CollectorError(Exception):
    """A problem that stops the collector from starting; reported as one line."""


def backoff(attempt: int, base: float = 1.0, cap: float = 60.0, retry_after_s: float | None = None) -> float:
    """Exponential backoff with full jitter: anywhere in ``[0, min(cap, base * 2**attempt)]``.

    A fleet that lost its gateway together then comes back spread over the whole window rather
    than in a band around its middle (±25 % before: 10,000 collectors within half a second of
    each other). When the gateway asked for a wait (``Retry-After``), at least that, spread
    over up to twice it."""
    delay = random.uniform(0.0, min(cap, base * 2**attempt))  # noqa: S311 - jitter, not crypto
    if retry_after_s:
        delay = max(delay, random.uniform(retry_after_s, 2 * retry_after_s))  # noqa: S311
    return float(delay)


def check_key_permissions(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise CollectorError(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")


def _limit(own: int, caps: Mapping[str, Any], provider: str) -> int:
    """The driver's concurrency, lowered (never raised) by the policy's cap for it or for "*"."""
    cap = caps.get(provider, caps.get("*"))
    if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1:
        return min(own, cap)
    return own


# Enrollment of older control planes wrote the letters.
_VAULT_LETTERS = {"A": "local", "B": "relayed", "C": "external"}


def _vault_mode(value: str) -> str:
    mode = _VAULT_LETTERS.get(value, value)
    return mode if mode in ("local", "relayed", "external") else "local"


def agent_version() -> str:
    from collector import __version__

    return __version__


log = get_logger("versus.collector")


class AgentState:
    """What every layer of the agent reads: options, identity, journal, drivers, vault mode."""

    def __init__(self, options: RunOptions):
        self.options = options
        self.paths = StatePaths(options.state_dir)
        if not self.paths.identity.exists():
            raise CollectorError(f"no identity in {options.state_dir}; run `versus-collector enroll` first")
        check_key_permissions(self.paths.key)
        self.identity = read_json(self.paths.identity)
        self.collector_id: str = self.identity["collector_id"]
        # Pinned at enrollment, moved forward in-band by signed rotation steps (collector/key_sets.py).
        self.pinned = PinnedKeys(self.paths.keys)
        self.trusted = self.pinned.dispatch
        policy = read_json(self.paths.policy) if self.paths.policy.exists() else {}
        # The signed config (once one arrived) overrides the enrollment policy's vault settings.
        try:
            self.config = ConfigStore(options.state_dir / "config.json", self.collector_id, self.trusted)
        except (DocumentError, ValueError) as exc:
            raise CollectorError(f"config.json is not a valid signed config: {exc}") from None
        self.offers = OfferCheck(self.collector_id, self.trusted)
        # The CAs trusted for the gateway (and the Collector CA that issues now), moved forward in-band.
        self.trust = TrustStore(self.paths, self.collector_id, self.trusted)
        running = self.config.current or {}
        self.vault_mode: str = _vault_mode(running.get("vault_mode") or policy.get("vault_mode", "local"))
        self.vault: dict[str, Any] = dict(running.get("vault") or {})
        # Mode A resolves credentials from the local file, re-read whenever it changes; in modes B and C
        # the local file is not read (their resolvers are described in docs/fleet.md).
        try:
            self.credentials: Callable[[], Credentials] = (
                LocalCredentials(options.state_dir, load_key(self.paths.key))
                if self.vault_mode == "local"
                else no_credentials
            )
        except ValueError as exc:
            raise CollectorError(str(exc)) from None
        self.drivers: dict[str, Driver] = registry.load(
            DriverContext(options.state_dir, self.credentials), options.drivers
        )
        # The policy from enrollment may lower a driver's own concurrency ({"*": 8} or per provider),
        # and bounds the long-poll so a claim - the heartbeat - goes out at least every interval.
        caps = policy.get("max_concurrency") or {}
        self.limits = {name: _limit(d.max_concurrency, caps, name) for name, d in self.drivers.items()}
        self.slots = {name: asyncio.Semaphore(n) for name, n in self.limits.items()}
        self.slot_freed = asyncio.Event()
        heartbeat = policy.get("heartbeat_interval_s")
        self.claim_wait_s = options.claim_wait_s
        if isinstance(heartbeat, int | float) and not isinstance(heartbeat, bool) and heartbeat > 0:
            self.claim_wait_s = min(options.claim_wait_s, float(heartbeat))
        self.in_flight: dict[str, int] = dict.fromkeys(self.drivers, 0)
        self.journal = Journal(options.state_dir / "journal.sqlite3")
        self.clock = ServerClock()
        self.clock_uncertainty_s: float | None = None  # None: no fresh round trip yet (local clock)
        self.context = ssl_context(self.paths)
        key = load_key(self.paths.key)
        self._identity_key = key  # opens credentials relayed to this collector (vault mode B)
        # Vault mode C: the session with the customer's Vault (collector/external_vault.py). Settings
        # that do not name an integration fail every credentialed task with the code, loudly.
        self.external: ExternalVault | None = None
        self.external_error: VaultError | None = None
        if self.vault_mode == "external":
            try:
                settings = VaultSettings.from_config(self.vault)
                # Imported here: the Vault client (hvac, requests) is for mode C alone.
                from collector.external_vault import ExternalVault

                self.external = ExternalVault(settings, options.state_dir, key, self.collector_id)
            except VaultError as exc:
                log.error("vault mode external without a usable integration", code=exc.code)
                self.external_error = exc
        else:
            (options.state_dir / SECRET_FILE).unlink(missing_ok=True)  # no longer this collector's to use
        self.client = GatewayClient(
            self.identity["gateway_url"], self.context, key, self.collector_id, ws_retry_s=options.ws_retry_s
        )
        self.renewer = Renewer(
            self.paths,
            key,
            self.collector_id,
            self.client.renew,
            wanted_issuer=lambda: self.trust.collector_active,
        )
        self.stopping = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        # A new id per process start: the control plane keeps one current session per collector.
        self.session_id = secrets.token_urlsafe(12)
        # Set when the control plane asked for a restart with new settings; main() re-executes.
        self.restart_requested = False
        self.fatal: str | None = None
        # Drivers in flight, stopped on the control plane's verdicts (collector/running.py).
        self.running = RunningTasks()
        # Ask for a verdict on every held task: at start, and after any claim that failed (an
        # answer carrying a cancel may have been lost with it).
        self.resume = True
        # For the loopback /metrics (collector/local_metrics.py): the last answered claim, the
        # tasks held at the last claim, the version this process runs.
        self.last_claim_at: float | None = None
        self.held_count = 0
        self.version = agent_version()

    # --- claiming -------------------------------------------------------------------------------
    def _free(self) -> dict[str, int]:
        return {name: self.limits[name] - self.in_flight[name] for name in self.drivers}

    async def _sleep(self, seconds: float, why: str) -> None:
        log.warning("gateway unavailable; backing off", seconds=round(seconds, 2), reason=why)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopping.wait()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- one task ---------------------------------------------------------------------------------
    def _now(self) -> float:
        """The server-corrected time."""
        return self.clock.now_s(time.time())
