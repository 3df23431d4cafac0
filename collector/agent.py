"""`versus-collector run`: claim, verify, execute, journal, report - until SIGTERM.

The loop claims one task at a time (claims are numbered and carry the task ids
the journal holds), verifies every envelope in the documented order, journals
receipt before executing and the result before reporting, and retries each
report until the gateway acknowledges it. See collector/journal.py for the
crash windows.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import secrets
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from collector.client import GatewayClient, GatewayRefused, GatewayUnavailable, ssl_context
from collector.credentials import Credentials, LocalCredentials, no_credentials
from collector.drivers import registry
from collector.drivers.base import Driver, DriverContext, Outcome, Supplied, Task, WindowClosed
from collector.external_vault import SECRET_FILE, ExternalVault, VaultError, VaultSettings, settings_key
from collector.journal import AlreadyReceived, Journal, Result, task_key
from collector.key_sets import PinnedKeys
from collector.output import TaskOutput, UploadFailed, saved_digest
from collector.renewal import Renewer
from collector.running import RunningTasks
from collector.signed_config import ConfigStore, OfferCheck
from collector.state import SUPERVISED_ENV, StatePaths, load_key, read_json, write_json
from collector.trust import TrustStore
from collector.tunnel import carry, dial_back_path
from common import signed_doc
from common.credential_relay import RelayError, open_for
from common.envelope.canonical import OpClass
from common.envelope.codes import EnvelopeError, Rejection
from common.envelope.fence import RoundTrip
from common.envelope.verify import ServerClock, VerifyContext, verify
from common.logs import get_logger
from common.protocol import floor_of
from common.signed_doc import RELAYED_CREDENTIAL, DocumentError

log = get_logger("versus.collector")


@dataclass(frozen=True)
class RunOptions:
    state_dir: Path
    claim_wait_s: float = 25.0
    grace_s: float = 30.0
    max_backoff_s: float = 60.0
    ws_retry_s: float = 60.0
    drivers: tuple[str, ...] | None = None


class CollectorError(Exception):
    """A problem that stops the collector from starting; reported as one line."""


# Refusals after which claiming again can never succeed: the process stops instead of retrying.
FATAL_CLAIM_CODES = {
    "collector_revoked": "this collector's identity was revoked; enroll again with a new token",
    "collector_denied": "this collector was denied at approval; enroll again with a new token",
    "certificate_expired": "this collector's certificate has expired; enroll again",
    "session_superseded": "another process started with this collector's identity and replaced this one",
}


# Refusals of a report that a fresh request can fix: the token was altered, moved or replayed on the
# way, or the clocks disagree (docs/threat-model.md). Any other refusal is final.
RETRYABLE_REPORT_REFUSALS = frozenset(
    {"bearer_wrong_body", "bearer_wrong_path", "bearer_wrong_method", "bearer_replayed",
     "bearer_not_yet_valid", "bearer_expired"}
)  # fmt: skip


def backoff(attempt: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Exponential backoff with ±25 % jitter, so a fleet does not reconnect in lockstep."""
    return float(min(cap, base * 2**attempt) * random.uniform(0.75, 1.25))  # noqa: S311 - jitter, not crypto


def check_key_permissions(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise CollectorError(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")


class Agent:
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

    # --- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        log.info("collector started", collector_id=self.collector_id, session_id=self.session_id,
                 vault_mode=self.vault_mode)  # fmt: skip
        # Beside everything else, for the life of the process; its failures never stop work.
        renewing = asyncio.create_task(self.renewer.run(self.stopping))
        vault = asyncio.create_task(self.external.keep_fresh(self.stopping)) if self.external else None
        try:
            await self._recover()
            await self._publish_capabilities()
            await self._claim_loop()
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)
            await self._drain()
            if self.external is not None and vault is not None:
                vault.cancel()
                await asyncio.gather(vault, return_exceptions=True)
                await self.external.close()  # its token is revoked, not left to expire
            if (self.stopping.is_set() or self.restart_requested) and self.fatal is None:
                await self._say_goodbye()
            await self.client.close()
            self.journal.close()

    async def _say_goodbye(self) -> None:
        """A clean stop: tell the control plane, so fleet views show offline (planned) instead of a
        lost collector and it stops waiting on us (protocol 2; best effort, a few seconds at most)."""
        reason = "restart" if self.restart_requested else "shutdown"
        try:
            async with asyncio.timeout(5):
                recorded = await self.client.bye(self.session_id, reason)
        except (GatewayUnavailable, GatewayRefused, TimeoutError) as exc:
            log.info("goodbye not delivered", reason=str(exc) or type(exc).__name__)
            return
        if recorded:
            log.info("said goodbye", reason=reason)

    async def _drain(self) -> None:
        if self.tasks:
            log.info("draining", in_flight=len(self.tasks), grace_s=self.options.grace_s)
            _, late = await asyncio.wait(self.tasks, timeout=self.options.grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _recover(self) -> None:
        """Finish what a previous run left: interrupted tasks are reported unknown, results re-reported."""
        for task_id, _ in self.journal.unfinished():
            log.warning("task interrupted by a restart; reporting unknown", task_id=task_id)
            # Under the task id: an unknown never answers a retry, and it must not overwrite a
            # result journaled under the idempotency key (an interrupted reconcile-read shares it).
            self.journal.record_result(
                task_id, task_key(task_id), Result("unknown", b"", "collector_restarted", "interrupted")
            )
        for pending in self.journal.pending_reports():
            digest = saved_digest(self.options.state_dir, pending.task_id)
            self._spawn(self._report(pending.task_id, pending.result, digest))
        self.journal.prune()

    async def _publish_capabilities(self) -> None:
        providers = registry.manifest(self.drivers)
        for entry in providers:
            entry["max_concurrency"] = self.limits[entry["provider"]]
        state = self.options.state_dir / "capabilities.json"
        previous = tuple(read_json(state)) if state.exists() else None
        epoch, digest = registry.epoch(providers, previous)
        body = {"capability_epoch": epoch, "fips": False, "agent_version": _version(), "providers": providers}
        attempt = 0
        while not self.stopping.is_set():
            try:
                await self.client.capabilities(body)
                write_json(state, [epoch, digest])
                log.info("capabilities published", epoch=epoch, providers=[p["provider"] for p in providers])
                return
            except GatewayUnavailable as exc:
                await self._sleep(backoff(attempt, cap=self.options.max_backoff_s), f"capabilities: {exc}")
                attempt += 1

    # --- claiming -------------------------------------------------------------------------------
    def _free(self) -> dict[str, int]:
        return {name: self.limits[name] - self.in_flight[name] for name in self.drivers}

    async def _claim_loop(self) -> None:
        attempt = 0
        while not self.stopping.is_set():
            wait_s = self.claim_wait_s
            if not any(v > 0 for v in self._free().values()):
                # Every slot is busy: nothing to ask for until one frees, but the claim is also the
                # heartbeat, so a claim that asks for nothing (capacity 0) still goes out each interval.
                self.slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed_or_stopping(), self.claim_wait_s)
                if self.stopping.is_set():
                    return
                if any(v > 0 for v in self._free().values()):
                    continue
                wait_s = 0.0
            body = {
                "session_id": self.session_id,
                "vault_mode": self.vault_mode,
                "config_version": self.config.version,
                "key_versions": {**self.pinned.versions(), "trust": self.trust.version},
                "claim_seq": self.journal.next_claim_seq(),
                "held_task_ids": self.journal.held_task_ids(),
                "capacity": self._free(),
                "agent_version": _version(),
                "wait_s": wait_s,
                "resume": self.resume,
            }
            report = self._update_report()
            if report is not None:
                body["update_status"] = report
            claim = asyncio.ensure_future(self.client.claim(body, wait_s))
            stop = asyncio.ensure_future(self.stopping.wait())
            done, _ = await asyncio.wait([claim, stop], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if claim not in done:
                claim.cancel()
                with contextlib.suppress(asyncio.CancelledError, GatewayUnavailable, GatewayRefused):
                    await claim
                return
            try:
                reply = claim.result()
            except GatewayUnavailable as exc:
                self.resume = True
                await self._sleep(backoff(attempt, cap=self.options.max_backoff_s), f"claim: {exc}")
                attempt += 1
                continue
            except GatewayRefused as exc:
                self.resume = True
                log.error("claim refused", code=exc.code, status=exc.status)
                if exc.code in FATAL_CLAIM_CODES:
                    self.fatal = FATAL_CLAIM_CODES[exc.code]
                    return
                await self._sleep(backoff(attempt, cap=self.options.max_backoff_s), exc.code)
                attempt += 1
                continue
            attempt = 0
            self.resume = False
            if reply.verdicts:
                self.running.apply(reply.verdicts, reply.cancel_grace_s)
            for revoke in reply.revokes:
                results = self.running.revoke(revoke["dispatch_ids"], kill=revoke["action"] == "kill")
                self._spawn(self._ack_revocation(revoke["revocation_id"], results))
            self._observe_clock(reply.round_trip)
            self._write_runtime()
            if reply.key_sets is not None:
                if self.pinned.apply(reply.key_sets):
                    # A step was refused: keep the last good set, and do not ask again at once.
                    await self._sleep(backoff(attempt, cap=self.options.max_backoff_s), "key set refused")
                    attempt += 1
                continue
            if reply.trust is not None:
                applied = self._apply_trust(reply.trust)
                if applied is None:
                    return
                if not applied:
                    await self._sleep(
                        backoff(attempt, cap=self.options.max_backoff_s), "trust bundle refused"
                    )
                    attempt += 1
                continue
            if reply.config is not None:
                outcome = self._apply_config(reply.config)
                if outcome == "restart":
                    return
                if outcome == "refused":
                    # Keep running on the last good config, and do not ask again at once.
                    await self._sleep(backoff(attempt, cap=self.options.max_backoff_s), "config refused")
                    attempt += 1
                continue
            for offered in reply.offers:
                try:
                    offer = self.offers.accept(offered, int(self._now()))
                except DocumentError as exc:
                    log.error("tunnel offer refused", code=exc.code, reason=str(exc))
                    continue
                self._spawn(
                    carry(
                        offer,
                        self.identity["gateway_url"],
                        self.context,
                        self.client.bearer("GET", dial_back_path(offer["session_id"])),
                        self.credentials(),
                    )
                )
            if reply.envelope is not None and reply.dispatch_id is not None:
                refusal = self._accept(
                    reply.dispatch_id, reply.envelope, reply.credentials.get(reply.dispatch_id)
                )
                if refusal is not None:
                    # Delivered before the next claim: a claim that does not list the dispatch as
                    # held would otherwise tell the router it was never received, and it would
                    # be handed out again and again.
                    await refusal

    def _observe_clock(self, trip: RoundTrip | None) -> None:
        """Correct the clock from a fresh, precise round trip only.

        An answer that sat in a buffer (the process was stopped, the host was busy) would
        make the offset absorb the delay and stretch every envelope's window; such a trip
        shows up as a large uncertainty and is ignored, keeping the last good offset.
        """
        if trip is None or not trip.usable():
            return
        self.clock = ServerClock(offset_s=trip.offset_s())
        self.clock_uncertainty_s = trip.uncertainty_s / 2

    async def _freed_or_stopping(self) -> None:
        freed = asyncio.ensure_future(self.slot_freed.wait())
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait([freed, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            freed.cancel()
            stop.cancel()

    def _apply_config(self, document: Mapping[str, Any]) -> Literal["restart", "applied", "refused"]:
        """Accept a newer signed config: ``restart`` when the process restarts to apply it,
        ``applied`` when nothing running changes (e.g. only the upgrade target did), ``refused``.

        A document that does not verify, is expired, or is not newer is refused (logged
        with its code) and the collector keeps its last good config. Vault settings apply
        on restart: in-flight work drains first, as a credential resolver is never swapped
        under a running task. An upgrade target is the supervisor's to act on.
        """
        try:
            payload = self.config.accept(document, int(self._now()))
        except DocumentError as exc:
            log.error("config refused; keeping the last good one", code=exc.code, reason=str(exc),
                      held_version=self.config.version)  # fmt: skip
            return "refused"
        log.info("config accepted", version=payload["version"])
        target = payload.get("update")
        if isinstance(target, dict) and target.get("version") != _version():
            # Installed by the supervisor, which reads the same signed config (docs/upgrades.md).
            log.info("upgrade target received", target=target.get("version"),
                     supervised=bool(os.environ.get(SUPERVISED_ENV)))  # fmt: skip
        if payload["vault_mode"] == self.vault_mode and settings_key(payload["vault"]) == settings_key(
            self.vault
        ):
            return "applied"
        log.warning("vault settings changed by an operator; restarting to apply them",
                    running=self.vault_mode, recorded=payload["vault_mode"])  # fmt: skip
        self.restart_requested = True
        return "restart"

    def _apply_trust(self, document: Mapping[str, Any]) -> bool | None:
        """Take a newer signed trust bundle: True when applied in place, False when refused (the
        held bundle stays), None when the process restarts to apply it.

        A CA added is trusted at once (the live TLS context learns it); a CA removed cannot be
        taken out of a live context, so the collector drains and restarts with the new file.
        """
        try:
            change = self.trust.accept(document, int(self._now()))
        except DocumentError as exc:
            log.error("trust bundle refused; keeping the held one", code=exc.code, reason=str(exc),
                      held_version=self.trust.version)  # fmt: skip
            return False
        log.info("trust bundle accepted", version=change.version, added=sorted(change.added),
                 removed=sorted(change.removed))  # fmt: skip
        self.renewer.nudge()
        if change.removed:
            log.warning("a CA was retired; restarting to stop trusting it", removed=sorted(change.removed))
            self.restart_requested = True
            return None
        if change.added:
            self.context.load_verify_locations(cadata=self.trust.pem_of(change.added))
        return True

    def _write_runtime(self) -> None:
        write_json(
            self.paths.runtime,
            {
                "last_claim_at": time.time(),
                "clock_offset_s": self.clock.offset_s,
                "clock_uncertainty_s": self.clock_uncertainty_s,
                # Which process answered: the supervisor's health window waits for its child's own.
                "pid": os.getpid(),
                "agent_version": _version(),
            },
        )

    def _update_report(self) -> dict[str, Any] | None:
        """The supervisor's last upgrade report (collector/supervisor), passed on with each claim."""
        try:
            return update_report(read_json(self.paths.update_status))
        except (OSError, ValueError):
            return None

    async def _sleep(self, seconds: float, why: str) -> None:
        log.warning("gateway unavailable; backing off", seconds=round(seconds, 2), reason=why)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- one task ---------------------------------------------------------------------------------
    def _now(self) -> float:
        """The server-corrected time."""
        return self.clock.now_s(time.time())

    def _accept(
        self, dispatch_id: str, raw: bytes, relayed: object = None
    ) -> Coroutine[Any, Any, None] | None:
        """Verify and journal the receipt before anything runs; execution continues in the background.

        Returns the refusal report to send (before the next claim) when the envelope is refused.
        """
        ctx = VerifyContext(
            collector_id=self.collector_id,
            now=self.clock.now(time.time()),
            trusted_keys=self.trusted,
            seen=self.journal,
            journal=self.journal,
        )
        try:
            accepted = verify(raw, ctx)
        except EnvelopeError as exc:
            if exc.code == Rejection.WRONG_COLLECTOR:
                log.error("envelope addressed to another collector: possible attack", dispatch_id=dispatch_id)
            else:
                log.warning("envelope refused", dispatch_id=dispatch_id, code=exc.code.value)
            return self._report_refusal(dispatch_id, exc.code.value, exc.message)
        f = accepted.envelope.fields
        read = f.op_class == OpClass.READ.value
        try:
            self.journal.record_receipt(f.task_id, f.idempotency_key, f.provider)
        except AlreadyReceived:
            return None
        if accepted.journaled is not None and not read:
            known = self.journal.result(f.idempotency_key)
            assert known is not None
            log.info("idempotency key already journaled; answering from the journal", task_id=f.task_id)
            self.journal.record_result(f.task_id, f.idempotency_key, known)
            self._spawn(self._report(f.task_id, known))
            return None
        # A stream only where the control plane takes one (protocol 4); it starts at the first write.
        output = None
        if self.client.protocol >= floor_of("output_stream"):
            output = TaskOutput(
                self.options.state_dir, f.task_id, self.client.output, self.options.max_backoff_s
            )
        task = Task(
            f.task_id, f.operation, f.target_ref, f.idempotency_key, accepted.envelope.params, f.lease_epoch,
            expires_at=f.expires_at, clock=self._now, output=output,
        )  # fmt: skip
        if self.vault_mode == "relayed":
            self._open_relayed(relayed, f.task_id, task.supplied)
        self.in_flight[f.provider] = self.in_flight.get(f.provider, 0) + 1
        self._spawn(self._execute(f.provider, task, read))
        return None

    def _open_relayed(self, document: object, dispatch_id: str, supplied: Supplied) -> None:
        """The credential relayed with a dispatch (vault mode B): verified as the control plane's,
        opened with this collector's key for this dispatch only; or the code it failed with."""
        if document is None:
            supplied.set(None)  # nothing stored for the device: the driver says no_credentials
            return
        try:
            payload = signed_doc.verify(
                document, self.trusted, kind=RELAYED_CREDENTIAL, collector_id=self.collector_id,
                now=int(self._now()),
            )  # fmt: skip
            value = open_for(self._identity_key, self.collector_id, dispatch_id, payload)
        except (DocumentError, RelayError) as exc:
            log.error("relayed credential refused", task_id=dispatch_id, code=exc.code)
            supplied.fail("credential_relay_invalid", "the credential relayed with this task did not open")
            return
        supplied.set(value)

    async def _execute(self, provider: str, task: Task, read: bool) -> None:
        try:
            try:
                outcome = await self._run_driver(provider, task)
                if outcome.status == "unknown":
                    outcome = await self._reconcile_locally(provider, task, outcome)
            except WindowClosed as exc:
                # Not attempted: a refusal, journaled apart from the key so a retry may still run it.
                log.warning("envelope window passed before the device write; not executed",
                            task_id=task.task_id, expires_at=task.expires_at)  # fmt: skip
                refusal = Result("refused", b"", exc.code, str(exc))
                self.journal.record_result(task.task_id, task_key(task.task_id), refusal)
                await self._report(task.task_id, refusal)
                return
        finally:
            self.in_flight[provider] -= 1
            self.slot_freed.set()
            # Whatever credential the task held is wiped with it (a relayed one above all).
            for held in task.held:
                held.scrub()
            task.supplied.scrub()
        digest = None
        stream = task.output if isinstance(task.output, TaskOutput) and task.output.started else None
        if stream is not None:
            try:
                digest = await stream.finish()  # the report vouches only for output the control plane holds
            except asyncio.CancelledError:
                stream.abandon()  # stopping hard: the upload goes with the task
                raise
            except UploadFailed as exc:
                stream.remove()
                stream = None
                if read and outcome.status == "success":
                    outcome = Outcome("failed", b"", exc.code, f"the output could not be delivered: {exc}")
        result = Result(outcome.status, outcome.result, outcome.error_code, outcome.error_message)
        # A read's answer is about that moment only (a reconcile-read above all): it must never
        # answer a later envelope with the same idempotency key, so it is journaled per task; so
        # is a cancel that changed nothing, which leaves the key free for a later attempt.
        key = task_key(task.task_id) if read or outcome.status == "cancelled" else task.idempotency_key
        self.journal.record_result(task.task_id, key, result)
        await self._report(task.task_id, result, digest, stream)

    async def _run_driver(self, provider: str, task: Task) -> Outcome:
        driver = self.drivers.get(provider)
        op = driver.operations.get(task.operation) if driver else None
        if driver is None or op is None:
            return Outcome(
                "failed", b"", "operation_not_supported", f"{provider}/{task.operation} is not installed"
            )
        async with self.slots[provider]:
            # Waiting for a slot (or a stopped process) may have outlived the envelope.
            if not task.window_open():
                task.check_window()
            if self.vault_mode == "external" and getattr(driver, "uses_credentials", True):
                await self._read_external(provider, task)
            return await self.running.run(task, driver.execute(task), op.timeout_s, op.op_class == "read")

    async def _read_external(self, provider: str, task: Task) -> None:
        """Vault mode C: the device's credential, read from the customer's Vault for this task
        (collector/external_vault.py); a failure is the code the driver fails the task with."""
        try:
            if self.external is None:
                raise self.external_error or VaultError("vault_config_invalid", "no Vault integration")
            task.supplied.set(await self.external.read(provider, task.target_ref))
        except VaultError as exc:
            log.error("device credential not read from the Vault", task_id=task.task_id, code=exc.code)
            task.supplied.fail(exc.code, str(exc))

    async def _reconcile_locally(self, provider: str, task: Task, unclear: Outcome) -> Outcome:
        """For a reconcilable mutation, ask the driver's reconcile-read before giving up as unknown."""
        driver = self.drivers[provider]
        op = driver.operations.get(task.operation)
        if op is None or op.op_class != "mutate_reconcilable" or not op.reconcile_operation:
            return unclear
        check = Task(
            task.task_id, op.reconcile_operation, task.target_ref, task.idempotency_key, task.params, 0
        )  # a read: no window check, it changes nothing
        answer = await self._run_driver(provider, check)
        if answer.status == "success":
            return Outcome("success", answer.result, "", "reconciled locally: applied")
        if answer.status == "failed" and answer.error_code == "":
            return Outcome("failed", b"", "not_applied", "reconciled locally: the change did not land")
        return unclear

    # --- reporting ----------------------------------------------------------------------------------
    async def _report(
        self,
        task_id: str,
        result: Result,
        digest: tuple[int, str] | None = None,
        stream: TaskOutput | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "task_id": task_id,
            "outcome": result.outcome,
            "error_code": result.error_code,
            "error_message": result.error_message[:4000],
        }
        if result.outcome != "refused":
            body["result_b64"] = base64.b64encode(result.result).decode()
        if digest is not None:
            body["output"] = {"length": digest[0], "sha256": digest[1]}
        await self._send_report(task_id, body, stream=stream)
        if digest is not None:
            (stream or TaskOutput(self.options.state_dir, task_id, self.client.output)).remove()

    async def _ack_revocation(self, revocation_id: str, results: Mapping[str, str]) -> None:
        """Tell the control plane what was scrubbed, until it has it (a lost ack leaves the
        revocation unanswered: the next resume claim carries it again and we answer again)."""
        attempt = 0
        while not self.stopping.is_set():
            try:
                await self.client.revoked(revocation_id, results)
                return
            except GatewayRefused as exc:
                log.error("revocation ack refused", revocation_id=revocation_id, code=exc.code)
                return
            except GatewayUnavailable as exc:
                await self._sleep(
                    backoff(attempt, base=0.5, cap=self.options.max_backoff_s), f"revoked: {exc}"
                )
                attempt += 1

    async def _report_refusal(self, task_id: str, code: str, message: str) -> None:
        body = {"task_id": task_id, "outcome": "refused", "error_code": code, "error_message": message[:4000]}
        await self._send_report(task_id, body, journaled=False)

    async def _send_report(
        self, task_id: str, body: Mapping[str, Any], journaled: bool = True, stream: TaskOutput | None = None
    ) -> None:
        """Resend the same report until acknowledged; never re-execute. A duplicate ack counts as success.
        A report naming more output than the control plane holds sends the rest of ``stream`` first."""
        attempt = 0
        deadline = None
        while True:
            try:
                await self.client.report(dict(body))
                break
            except GatewayRefused as exc:
                acked = exc.details.get("acked")
                if exc.code == "output_incomplete" and stream is not None and isinstance(acked, int):
                    log.warning("the control plane holds less output than reported; sending the rest",
                                task_id=task_id, acked=acked)  # fmt: skip
                    try:
                        await stream.upload_again_from(acked)
                    except UploadFailed as failed:
                        log.error("output refused; report not sent", task_id=task_id, code=failed.code)
                        break
                    continue
                if exc.code not in RETRYABLE_REPORT_REFUSALS:
                    # 403/409: the control plane will never accept it; the journal keeps the evidence.
                    log.error("report refused", task_id=task_id, code=exc.code)
                    break
                # Something on the path altered or replayed the request, or the clocks disagree: the
                # same report with a fresh token may well go through. Never lose a result to that.
                delay = backoff(attempt, base=0.5, cap=self.options.max_backoff_s)
                log.warning("report refused in transit; retrying", task_id=task_id, code=exc.code,
                            seconds=round(delay, 2))  # fmt: skip
                await asyncio.sleep(delay)
                attempt += 1
            except GatewayUnavailable as exc:
                if self.stopping.is_set():
                    deadline = deadline or time.monotonic() + self.options.grace_s
                    if time.monotonic() > deadline:
                        log.warning(
                            "giving up on a report for now; it is re-sent on the next start", task_id=task_id
                        )
                        return
                delay = backoff(attempt, base=0.5, cap=self.options.max_backoff_s)
                log.warning(
                    "report not delivered; retrying",
                    task_id=task_id,
                    seconds=round(delay, 2),
                    reason=str(exc),
                )
                await asyncio.sleep(delay)
                attempt += 1
        if journaled:
            self.journal.mark_reported(task_id)


UPDATE_STATES = ("updating", "updated", "rolled_back", "failed")
# The gateway refuses a report dated after this (gateway/collector_api.py): never send one.
LATEST_REPORT_TIME_S = 4_102_444_800


def update_report(raw: object) -> dict[str, Any] | None:
    """The supervisor's report as the claim carries it, or None when it is not one the gateway
    would accept: a damaged file must never stop the collector from claiming."""
    if not isinstance(raw, dict):
        return None
    state, version, detail, at = raw.get("state"), raw.get("version"), raw.get("detail", ""), raw.get("at", 0)
    if state not in UPDATE_STATES or not isinstance(version, str) or not 0 < len(version) <= 64:
        return None
    if not version.isprintable() or not isinstance(detail, str):
        return None
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= LATEST_REPORT_TIME_S:
        at = 0
    return {"state": state, "version": version, "detail": detail[:500], "at": at}


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


def _version() -> str:
    from collector import __version__

    return __version__


def summary(state_dir: Path) -> dict[str, Any]:
    """Local facts for `versus-collector status`: journal size, in-flight work, last claim."""
    paths = StatePaths(state_dir)
    runtime_path = paths.root / "runtime.json"
    runtime = read_json(runtime_path) if runtime_path.exists() else {}
    journal_path = state_dir / "journal.sqlite3"
    counts = {"received": 0, "results": 0, "held": 0}
    if journal_path.exists():
        journal = Journal(journal_path)
        counts = journal.counts()
        journal.close()
    identity = read_json(paths.identity) if paths.identity.exists() else {}
    return {
        "gateway_url": identity.get("gateway_url", ""),
        "journal": counts,
        "last_claim_at": runtime.get("last_claim_at"),
        "clock_offset_s": runtime.get("clock_offset_s"),
        "clock_uncertainty_s": runtime.get("clock_uncertainty_s"),
    }
