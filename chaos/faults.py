"""Seeded faults against the running stack, each recorded with the window it may disturb."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from chaos.stack import ChaosStack

# Kind -> weight. Every kind a production deployment must survive without losing or repeating work.
KINDS = {
    "collector_sigkill": 3,
    "collector_sigstop": 2,
    "router_restart": 2,
    "gateway_restart": 2,
    "postgres_restart": 1,
    "redis_flushall": 1,
    "redis_restart": 1,
}
# After a fault ends, errors seen this long are still blamed on it (clients back off and retry).
RECOVERY_S = 15.0


@dataclass(frozen=True, slots=True)
class Window:
    kind: str
    started: float  # time.monotonic()
    ended: float
    detail: str

    def covers(self, at: float) -> bool:
        return self.started - 1.0 <= at <= self.ended + RECOVERY_S


@dataclass
class Injector:
    stack: ChaosStack
    seed: int
    windows: list[Window] = field(default_factory=list)

    @property
    def counts(self) -> Counter[str]:
        return Counter(w.kind for w in self.windows)

    async def run(self, seconds: float, every_s: float) -> None:
        """Inject a fault about every ``every_s`` seconds (exponential gaps) for ``seconds``."""
        rng = random.Random(self.seed * 7919 + 1)
        kinds, weights = list(KINDS), list(KINDS.values())
        ends = time.monotonic() + seconds
        while True:
            await asyncio.sleep(rng.expovariate(1 / every_s))
            if time.monotonic() >= ends:
                return
            kind = rng.choices(kinds, weights)[0]
            started = time.monotonic()
            detail = await asyncio.to_thread(self._inject, kind, rng)
            self.windows.append(Window(kind, started, time.monotonic(), detail))

    def _inject(self, kind: str, rng: random.Random) -> str:
        stack = self.stack
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
        if kind in ("router_restart", "gateway_restart"):
            service = stack.services[kind.removesuffix("_restart")]
            service.kill()
            time.sleep(rng.uniform(0.5, 3))
            service.start()
            stack.wait_ready()
            return service.name
        if kind == "postgres_restart":
            stack.postgres.stop()
            stack.postgres.start()
            return "fast shutdown and start"
        client = stack.redis_client()
        try:
            if kind == "redis_flushall":
                client.flushall()
                return "FLUSHALL"
        finally:
            client.close()
        stack.redis.stop()
        stack.redis.start()
        return "stop and start"
