"""Run a seeded workload under injected faults and check the promises (chaos/checker.py).

    python -m chaos.run [--seed 1] [--seconds 120] [--rate 4] [--fault-every 8] [--collectors 4]
                        [--devices 6] [--deadline 60] [--keep] [--drill]

With ``--drill`` the stack runs on the data tier of deploy/ (Patroni with two PostgreSQL nodes and
three etcd members, a Redis Sentinel group) and the faults are the failover drill's, once each,
in order, ``--fault-every`` seconds apart: the PostgreSQL primary SIGKILLed, an etcd member lost,
Redis failed over (chaos/ha.py). What they measured is printed with the report.

Exit status 0 when no promise was broken, 1 otherwise; the summary lists tasks by
final state, faults by kind and every violation. The same seed gives the same
workload and the same fault schedule (timings of the system's own reactions vary).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from chaos import checker, ha
from chaos.faults import Injector
from chaos.stack import ChaosStack
from chaos.workload import Workload
from common.grpc.client import aio_channel

SWEEP_S = 5.0


@dataclass(frozen=True, slots=True)
class Config:
    seed: int = 1
    seconds: float = 120.0
    rate: float = 4.0
    fault_every: float = 8.0
    collectors: int = 4
    devices: int = 6
    deadline: float = 60.0
    # Comma-separated fault kinds injected in this order, round robin; empty: all kinds, weighted.
    faults: str = ""
    # The failover drill (chaos/ha.py) on the HA data tier instead of the random faults.
    drill: bool = False


@dataclass
class Report:
    tasks: Counter[str]
    faults: Counter[str]
    violations: list[str]
    measures: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [
            *self.measures,
            "tasks: " + ", ".join(f"{state} {n}" for state, n in sorted(self.tasks.items())),
            "faults: " + (", ".join(f"{kind} {n}" for kind, n in sorted(self.faults.items())) or "none"),
            f"violations: {len(self.violations)}",
            *(f"  - {v}" for v in self.violations),
        ]
        return "\n".join(lines)


async def _drive(stack: ChaosStack, config: Config, token: str) -> Report:
    workload = Workload(config.seed, config.devices, stack.site_id, config.deadline)
    if config.drill:
        injector = Injector(stack, config.seed, list(ha.DRILL), once=True)
    else:
        injector = Injector(stack, config.seed, [k for k in config.faults.split(",") if k])
    started_wall, started_mono = time.time(), time.monotonic()
    router = f"127.0.0.1:{stack.env['VERSUS_ROUTER_PORT']}"
    async with aio_channel(router, token) as channel:
        await asyncio.gather(
            workload.run(channel, config.rate, config.seconds),
            injector.run(config.seconds, config.fault_every),
        )
        await injector.finish()
        # Every accepted task must be settled by its deadline plus a sweep (and the time the
        # last fault's recovery took, which the deadline already covers).
        await workload.settle(channel, config.deadline + 3 * SWEEP_S)
    # Let post-commit counter updates land, then compare Redis with PostgreSQL.
    await asyncio.sleep(2.0)
    # A service must outlive every fault: one that died is named, with its last words.
    died = [why for why in (proc.exited() for proc in stack.services.values()) if why]
    _, spans, in_flight = checker.database_facts(stack.postgres.url)
    facts = checker.task_facts(stack.postgres.url)
    names = {cid: proc.name for cid, proc in stack.by_collector_id.items()}
    clock = checker.Clock(started_wall, started_mono)
    applied = checker.applications(stack.devices)
    violations = died + checker.check_facts(workload.tasks, facts, applied, injector.windows, clock, names)
    violations += injector.findings.problems
    violations += checker.writer_order(stack.devices)
    violations += checker.overlaps(spans)
    with stack.redis_client() as client:
        violations += checker.check_counters(client, in_flight)
    errors = checker.server_errors(stack.root / "gateway.log", started_wall, started_mono)
    violations += checker.outside_windows([*errors, *workload.errors], injector.windows, started_mono)
    states = Counter(
        t.state or ("refused " + t.refused if t.refused else "never accepted") for t in workload.tasks
    )
    return Report(states, injector.counts, violations, injector.findings.measures)


def _mint_platform_token(stack: ChaosStack) -> str:
    created = stack.cli("access", "create", "chaos-platform", "--role", "platform", "--all-tenants")
    return str(created["plaintext"])


def run(config: Config, root: Path) -> Report:
    stack = ChaosStack(root, ha=config.drill)
    try:
        stack.start(config.collectors)
        return asyncio.run(_drive(stack, config, _mint_platform_token(stack)))
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = Config()
    for name in Config.__slots__:
        value = getattr(defaults, name)
        if isinstance(value, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action="store_true")
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs, devices)")
    parser.add_argument("--json", dest="json_path", help="also write the report as JSON here")
    args = parser.parse_args()
    config = Config(**{name: getattr(args, name) for name in Config.__slots__})
    root = Path(tempfile.mkdtemp(prefix="versus-chaos-"))
    try:
        report = run(config, root)
    finally:
        if args.keep:
            print(f"run directory: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    rate, every = f"{config.rate:g} tasks/s", f"faults ~{config.fault_every:g}s apart"
    print(f"seed {config.seed}, {config.seconds:g}s at {rate}, {every}")
    print(report.render())
    if args.json_path:
        Path(args.json_path).write_text(
            json.dumps(
                {
                    "config": vars(args),
                    "tasks": report.tasks,
                    "faults": report.faults,
                    "violations": report.violations,
                    "measures": report.measures,
                },
                indent=2,
                default=str,
            )
        )
    sys.exit(1 if report.violations else 0)


if __name__ == "__main__":
    main()
