"""The claim loop: one numbered claim at a time, with the journal's task ids; the signed config,
key sets and trust bundle it hands back applied; the supervisor's update report carried."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any, Literal

from collector.agent_state import agent_version, backoff, log
from collector.execution import Execution
from collector.gateway_errors import GatewayRefused, GatewayUnavailable
from collector.state import SUPERVISED_ENV, read_json, write_json
from collector.tunnel import carry
from collector.vault_settings import settings_key
from common.envelope.fence import RoundTrip
from common.envelope.verify import ServerClock
from common.trust.signed_doc import DocumentError

# Refusals after which claiming again can never succeed: the process stops instead of retrying.
FATAL_CLAIM_CODES = {
    "collector_revoked": "this collector's identity was revoked; enroll again with a new token",
    "collector_denied": "this collector was denied at approval; enroll again with a new token",
    "certificate_expired": "this collector's certificate has expired; enroll again",
    "session_superseded": "another process started with this collector's identity and replaced this one",
}


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


class ClaimLoop(Execution):
    """Claims until stopped, applying what each answer hands back."""

    async def _claim_loop(self) -> None:
        attempt = 0
        while not self.stopping.is_set():
            wait_s = self.claim_wait_s
            if not any(v > 0 for v in self._free().values()):
                # Every slot is busy: nothing to ask for until one frees, but the claim is also the
                # heartbeat, so a claim that asks for nothing (capacity 0) still goes out each interval.
                self.slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.claim_wait_s):
                        await self._freed_or_stopping()
                if self.stopping.is_set():
                    return
                if any(v > 0 for v in self._free().values()):
                    continue
                wait_s = 0.0
            held = self.journal.held_task_ids()
            self.held_count = len(held)
            body = {
                "session_id": self.session_id,
                "vault_mode": self.vault_mode,
                "config_version": self.config.version,
                "key_versions": {**self.pinned.versions(), "trust": self.trust.version},
                "claim_seq": self.journal.next_claim_seq(),
                "held_task_ids": held,
                "capacity": self._free(),
                "agent_version": agent_version(),
                "wait_s": wait_s,
                "resume": self.resume,
            }
            report = self._update_report()
            if report is not None:
                body["update_status"] = report
            # Idle (every slot free): on the socket the claim may wait long, as nothing it says can
            # change until work comes, and the gateway keeps its heartbeat from the socket's pings.
            # A partly busy one keeps the heartbeat interval: its capacity grows as tasks end, and
            # only its next claim says so.
            idle = wait_s > 0 and not any(self.in_flight.values())
            socket_wait = self.options.socket_claim_wait_s if idle else None
            claim = asyncio.ensure_future(self.client.claim(body, wait_s, socket_wait))
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
                delay = backoff(attempt, cap=self.options.max_backoff_s, retry_after_s=exc.retry_after_s)
                await self._sleep(delay, f"claim: {exc}")
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
                results = self.running.revoke(
                    revoke["revocation_id"], revoke["dispatch_ids"], kill=revoke["action"] == "kill"
                )
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
                        lambda path: self.client.bearer("GET", path),
                        self.credentials(),
                    )
                )
            if reply.envelope is not None and reply.dispatch_id is not None:
                refusal = self._accept(
                    reply.dispatch_id, reply.envelope, reply.credentials.get(reply.dispatch_id),
                    reply.traceparent,
                )  # fmt: skip
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
        if isinstance(target, dict) and target.get("version") != agent_version():
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
        self.last_claim_at = time.time()
        write_json(
            self.paths.runtime,
            {
                "last_claim_at": time.time(),
                "clock_offset_s": self.clock.offset_s,
                "clock_uncertainty_s": self.clock_uncertainty_s,
                # Which process answered: the supervisor's health window waits for its child's own.
                "pid": os.getpid(),
                "agent_version": agent_version(),
                # What `versus-collector status` shows (collector/status.py).
                "session_id": self.session_id,
                "protocol": self.client.protocol,
                "transport": self.client.transport,
                "vault_mode": self.vault_mode,
                "in_flight": {p: n for p, n in self.in_flight.items() if n},
            },
        )

    def _update_report(self) -> dict[str, Any] | None:
        """The supervisor's last upgrade report (collector/supervisor), passed on with each claim."""
        try:
            return update_report(read_json(self.paths.update_status))
        except (OSError, ValueError):
            return None
