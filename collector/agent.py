"""`versus-collector run`: claim, verify, execute, journal, report - until SIGTERM.

The loop claims one task at a time (claims are numbered and carry the task ids
the journal holds), verifies every envelope in the documented order, journals
receipt before executing and the result before reporting, and retries each
report until the gateway acknowledges it. See collector/journal.py for the
crash windows.
"""

from __future__ import annotations

import asyncio
import signal

from collector.agent_state import agent_version, backoff, log
from collector.claim_loop import ClaimLoop
from collector.drivers import registry
from collector.gateway_errors import GatewayRefused, GatewayUnavailable
from collector.journal import Result, task_key
from collector.output import saved_digest
from collector.state import read_json, write_json


class Agent(ClaimLoop):
    """The collector process: capabilities, recovery, the claim loop, drain and goodbye."""

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
        body = {
            "capability_epoch": epoch,
            "fips": False,
            "agent_version": agent_version(),
            "providers": providers,
        }
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
