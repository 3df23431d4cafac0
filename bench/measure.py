"""What the benchmarks measure besides wall time: percentiles, CPU per process of the stack, and
optional py-spy profiles of a service while a phase runs."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bench.stack import Stack


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[index]


@asynccontextmanager
async def profiling(meter: CpuMeter, service: str, path: str | None) -> AsyncIterator[None]:
    """Sample ``service`` with py-spy while the block runs (no change to the process); at the end
    write an SVG flame graph to ``path``, or collapsed stacks when it ends in ``.txt``. No path:
    nothing is sampled."""
    if not path:
        yield
        return
    profiler = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "py-spy"), "record", "--output", path,
        "--format", "raw" if path.endswith(".txt") else "flamegraph",
        "--pid", str(meter.service_pid(service)), "--rate", "200", "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
        await asyncio.wait_for(profiler.wait(), 60)


# The key, among PostgreSQL's process ids, of the CPU time of its backends that have ended.
REAPED = -1


class CpuMeter:
    """CPU seconds (user + system) used by each part of the stack between two snapshots."""

    def __init__(self, stack: Stack):
        import psutil

        self._psutil = psutil
        self.stack = stack

    def service_pid(self, name: str) -> int:
        """The process id of one service of the stack (``router``, ``gateway``, ``enrollment``)."""
        [process] = self._groups()[name]
        return int(process.pid)

    def _groups(self) -> dict[str, list[Any]]:
        psutil = self._psutil
        groups: dict[str, list[Any]] = {
            "router": [],
            "gateway": [],
            "enrollment": [],
            "postgres": [],
            "redis": [],
        }
        for child in psutil.Process(self.stack.cp.proc.pid).children(recursive=True):
            cmd = " ".join(child.cmdline())
            for name in ("router", "gateway", "enrollment"):
                if cmd.endswith(f"versus_cp {name}"):
                    groups[name].append(child)
        if self.stack.postgres.pid:
            master = psutil.Process(self.stack.postgres.pid)
            groups["postgres"] = [master, *master.children(recursive=True)]
        if self.stack.redis.pid:
            groups["redis"] = [psutil.Process(self.stack.redis.pid)]
        groups["load generator"] = [psutil.Process()]
        return groups

    def snapshot(self) -> dict[str, dict[int, float]]:
        """CPU seconds so far of every process of each part, by process id."""
        out: dict[str, dict[int, float]] = {}
        for name, procs in self._groups().items():
            out[name] = {}
            for proc in procs:
                try:
                    times = proc.cpu_times()
                    out[name][proc.pid] = times.user + times.system
                except self._psutil.Error:
                    pass
        if self.stack.postgres.pid:
            # Backends that ended are reaped by the postmaster, whose children's times then hold
            # theirs: a pool that opens and closes connections under load would otherwise hide the
            # work those backends did (it hid most of PostgreSQL's until 2026-12-05).
            try:
                reaped = self._psutil.Process(self.stack.postgres.pid).cpu_times()
                out["postgres"][REAPED] = reaped.children_user + reaped.children_system
            except self._psutil.Error:
                pass
        return out

    @staticmethod
    def delta(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
        """CPU seconds of each part between two snapshots, summed per process: PostgreSQL backends
        come and go, and a total over a different set of processes would hide or invent time. A
        process started in between counts whole; one that ended in between counts through its parent's
        reaped-children time (PostgreSQL's postmaster: ``REAPED``), whole, so a backend that was already
        running at the first snapshot counts its time before it too (a pool that keeps its connections
        has almost none that end)."""
        return {
            name: sum(max(0.0, cpu - before.get(name, {}).get(pid, 0.0)) for pid, cpu in procs.items())
            for name, procs in after.items()
        }
