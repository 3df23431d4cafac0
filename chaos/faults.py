"""Seeded faults against the running stack, each recorded with the window it may disturb."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from chaos import ha
from chaos.stack import ChaosStack

# Kind -> weight. Every kind a production deployment must survive without losing or repeating work.
KINDS = {
    "collector_sigkill": 3,
    "collector_sigstop": 2,
    # Frozen past its dispatches' timeouts: the router gives up on the silent holder (sweep, ladder)
    # while other faults go on; the collector then wakes holding stale work. Runs in the background.
    "collector_long_stop": 1,
    # Every collector connection (WSS control and HTTPS alike) cut mid-flight, no process restarted.
    "connection_drop": 2,
    # SIGKILL of the collector that holds a mutation right now (found in PostgreSQL): recorded as
    # collector_sigkill_<dispatch state>, leased = mid-claim, dispatched/running = the change may
    # be applied and the report not sent yet (the stub sleeps after applying).
    "collector_sigkill_holder": 3,
    # The same target frozen for 2-8 s instead (collector_sigstop_<dispatch state>).
    "collector_sigstop_holder": 1,
    "router_restart": 2,
    "gateway_restart": 2,
    "postgres_restart": 1,
    "redis_flushall": 1,
    "redis_restart": 1,
}
# The data tier's own failures (chaos/ha.py), injected on the HA stack only (`--drill`).
HA_KINDS = {"postgres_primary_kill": 1, "etcd_member_loss": 1, "redis_failover": 1}
# After a fault ends, errors seen this long are still blamed on it (clients back off and retry).
RECOVERY_S = 5.0
# Faults of a component an answer depends on: only these may explain a 5xx or a failed platform
# call. Collector faults and cut collector connections never should.
SERVER_SIDE = frozenset(
    {
        "router_restart", "gateway_restart", "postgres_restart", "redis_flushall", "redis_restart",
        # Of a scaled-out deployment (tests/e2e/test_multi_host.py): one replica of several.
        "enrollment_restart", "redis_failover", "postgres_primary_kill", "etcd_member_loss",
    }
)  # fmt: skip
# Faults that touch every task in flight, not one collector's.
GLOBAL = SERVER_SIDE | {"connection_drop"}
# How long a collector_long_stop freezes its victim: around the stub operations' 30-60 s timeouts.
LONG_STOP_S = (20.0, 50.0)
# How long collector_sigkill_holder looks for a collector holding a mutation before killing any.
HOLDER_SEARCH_S = 5.0


@dataclass(frozen=True, slots=True)
class Window:
    kind: str
    started: float  # time.monotonic()
    ended: float
    detail: str

    def covers(self, at: float) -> bool:
        """Whether an error at ``at`` may be blamed on this fault (server-side faults only)."""
        return self.kind in SERVER_SIDE and self.started - 1.0 <= at <= self.ended + RECOVERY_S

    @property
    def victim(self) -> str:
        """The collector process a collector fault hit ('' for a global fault)."""
        return "" if self.kind in GLOBAL else self.detail.split(" ", 1)[0]

    def overlaps(self, start: float, end: float) -> bool:
        return self.started - 1.0 <= end and start <= self.ended + RECOVERY_S


@dataclass
class Injector:
    stack: ChaosStack
    seed: int
    # Kinds to inject in this order, round robin (a short run that must cover them); empty: weighted.
    sequence: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    # Run the sequence once, then stop injecting (the drill: each fault after the last healed).
    once: bool = False
    findings: ha.Findings = field(default_factory=ha.Findings)
    _background: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def counts(self) -> Counter[str]:
        return Counter(w.kind for w in self.windows)

    async def run(self, seconds: float, every_s: float) -> None:
        """Inject a fault about every ``every_s`` seconds (exponential gaps) for ``seconds``."""
        rng = random.Random(self.seed * 7919 + 1)
        kinds, weights = list(KINDS), list(KINDS.values())
        unknown = set(self.sequence) - set(KINDS) - set(HA_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))}")
        ends = time.monotonic() + seconds
        n = 0
        while True:
            gap = rng.expovariate(1 / every_s)
            # The drill's faults are evenly spaced: each heals before the next lands.
            await asyncio.sleep(every_s if self.once else gap)
            if time.monotonic() >= ends or (self.once and n >= len(self.sequence)):
                return
            weighted = rng.choices(kinds, weights)[0]  # drawn either way: the schedule stays seeded
            kind = self.sequence[n % len(self.sequence)] if self.sequence else weighted
            n += 1
            started = time.monotonic()
            if kind == "collector_long_stop":
                self._background.append(asyncio.create_task(self._long_stop(rng)))
                continue
            detail = await asyncio.to_thread(self._inject, kind, rng)
            if kind.endswith("_holder"):
                kind, _, detail = detail.partition(" ")
            self.windows.append(Window(kind, started, time.monotonic(), detail))

    async def finish(self) -> None:
        """Wait for background faults (long stops) to end: every process is running again after."""
        await asyncio.gather(*self._background)

    async def _long_stop(self, rng: random.Random) -> None:
        victim = rng.choice(self.stack.collectors)
        pause = rng.uniform(*LONG_STOP_S)
        started = time.monotonic()
        victim.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(pause)
        finally:
            # A SIGKILL fault meanwhile restarts the victim (Proc.kill continues it first).
            victim.signal(signal.SIGCONT)
        self.windows.append(Window("collector_long_stop", started, time.monotonic(), f"{victim.name}"))

    def _hit_holder(self, rng: random.Random, stop: bool) -> str:
        """SIGKILL (or SIGSTOP) a collector holding a mutation; '<kind> <detail>'.

        A random collector when none holds one within HOLDER_SEARCH_S.
        """
        deadline = time.monotonic() + HOLDER_SEARCH_S
        while time.monotonic() < deadline:
            with psycopg.connect(self.stack.postgres.url) as conn:
                holders = conn.execute(
                    "SELECT collector_id, dispatch_id, state FROM dispatches"
                    " WHERE op_class <> 'read' AND state IN ('leased', 'dispatched', 'running')"
                    " ORDER BY dispatch_id"
                ).fetchall()
            holders = [h for h in holders if h[0] in self.stack.by_collector_id]
            if holders:
                collector_id, dispatch_id, state = rng.choice(holders)
                victim = self.stack.by_collector_id[collector_id]
                if stop:
                    victim.signal(signal.SIGSTOP)
                    time.sleep(rng.uniform(2, 8))
                    victim.signal(signal.SIGCONT)
                else:
                    victim.kill()
                    time.sleep(rng.uniform(1, 4))
                    victim.start()
                how = "sigstop" if stop else "sigkill"
                return f"collector_{how}_{state} {victim.name} holding {dispatch_id}"
            time.sleep(0.05)
        fallback = "collector_sigstop" if stop else "collector_sigkill"
        return f"{fallback} " + self._inject(fallback, rng)

    def _inject(self, kind: str, rng: random.Random) -> str:
        stack = self.stack
        if kind.endswith("_holder"):
            return self._hit_holder(rng, stop=kind == "collector_sigstop_holder")
        if kind in ("collector_sigkill", "collector_sigstop"):
            victim = rng.choice(stack.collectors)
            if kind == "collector_sigkill":
                victim.kill()
                time.sleep(rng.uniform(1, 4))
                victim.start()
                return victim.name
            pause = rng.uniform(2, 8)
            victim.signal(signal.SIGSTOP)
            time.sleep(pause)
            victim.signal(signal.SIGCONT)
            return f"{victim.name} for {pause:.1f}s"
        if kind == "connection_drop":
            return f"{stack.proxy.cut()} connections cut"
        if kind in ("router_restart", "gateway_restart"):
            service = stack.services[kind.removesuffix("_restart")]
            service.kill()
            time.sleep(rng.uniform(0.5, 3))
            service.start()
            stack.wait_ready()
            return service.name
        if kind == "postgres_restart":
            postgres, _ = stack.embedded
            postgres.stop()
            postgres.start()
            return "fast shutdown and start"
        if kind == "postgres_primary_kill":
            return ha.primary_kill(stack, self.findings)
        if kind == "etcd_member_loss":
            return ha.etcd_member_loss(stack, self.findings, rng)
        if kind == "redis_failover":
            return ha.redis_failover(stack, self.findings)
        client = stack.redis_client()
        try:
            if kind == "redis_flushall":
                client.flushall()
                return "FLUSHALL"
        finally:
            client.close()
        _, redis = stack.embedded
        redis.stop()
        redis.start()
        return "stop and start"
