"""How many processes of each kind a fleet needs, calculated from what the benchmarks measured.

    .venv/bin/python -m bench.sizing [--collectors 100000] [--tasks-per-s 500] [--markdown]

Inputs come from the recorded runs, not from constants here: per idle collector
the gateway's memory and CPU and the router's CPU (bench/results/idle.json,
``make bench-idle``), per task each process's CPU and the SQL statements and
transactions it costs (bench/results/throughput.json, ``make bench-throughput``).
Each service process is one asyncio event loop, so it uses at most one core;
the plan keeps every process under ``--utilization`` of its core (default
0.7, headroom for bursts and a reconnect storm) and adds one spare of each kind
so a process can die or drain without overloading the rest (N+1).

What it cannot know, and docs/deployment.md says: PostgreSQL's limit is its
commit rate and I/O as much as CPU; the figure here is its CPU only, scaled from
one 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Costs:
    """Measured costs (per idle collector at its claim rate, per task)."""

    gateway_mib_per_collector: float
    gateway_base_mib: float
    gateway_cores_per_collector: float
    router_cores_per_collector: float
    router_ms_per_task: float
    gateway_ms_per_task: float
    postgres_ms_per_task: float
    redis_ms_per_task: float
    statements_per_task: float
    transactions_per_task: float
    measured_fleet: int


@dataclass(frozen=True, slots=True)
class Plan:
    gateways: int
    routers: int
    gateway_mib_each: float
    gateway_core_share: float
    router_core_share: float
    postgres_cores: float
    statements_per_s: float
    transactions_per_s: float
    claims_per_s: float
    redis_cores: float


def load_costs(results: Path = RESULTS) -> Costs:
    """The costs of the largest HTTPS idle run and of the single-task throughput run."""
    idle = json.loads((results / "idle.json").read_text())["results"]
    run = max((r for r in idle if r["transport"] == "https"), key=lambda r: r["collectors"])
    n = int(run["collectors"])
    single = json.loads((results / "throughput.json").read_text())["results"]["single"]
    cpu = single["cpu_ms_per_task"]
    statements = single["statements_per_task"]
    return Costs(
        gateway_mib_per_collector=(run["gateway_rss_mib"] - run["gateway_rss_idle_mib"]) / n,
        gateway_base_mib=run["gateway_rss_idle_mib"],
        gateway_cores_per_collector=run["gateway_cpu_pct"] / 100 / n,
        router_cores_per_collector=run["router_cpu_pct"] / 100 / n,
        router_ms_per_task=cpu["router"],
        gateway_ms_per_task=cpu["gateway"],
        postgres_ms_per_task=cpu["postgres"],
        redis_ms_per_task=cpu["redis"],
        statements_per_task=statements["total"],
        transactions_per_task=statements["begin_commit_total"] / 2,
        measured_fleet=n,
    )


# A held claim is answered after at most this long and the collector claims again at once
# (VERSUS_CLAIM_HOLD_S's default): the idle fleet's claim rate is collectors / HOLD_S.
HOLD_S = 25.0
# SQL statements of a claim that finds no work: the standing read and the take
# (docs/benchmarks.md, "SQL statements per task").
STATEMENTS_PER_IDLE_CLAIM = 2


def plan(costs: Costs, collectors: int, tasks_per_s: float, utilization: float = 0.7) -> Plan:
    """Processes needed for ``collectors`` held and ``tasks_per_s`` run, each under ``utilization``
    of a core, plus one spare of each kind."""
    tasks_cores = tasks_per_s / 1000
    gateway_load = collectors * costs.gateway_cores_per_collector + tasks_cores * costs.gateway_ms_per_task
    router_load = collectors * costs.router_cores_per_collector + tasks_cores * costs.router_ms_per_task
    claims_per_s = collectors / HOLD_S
    gateways = max(1, math.ceil(gateway_load / utilization)) + 1
    routers = max(1, math.ceil(router_load / utilization)) + 1
    serving = gateways - 1  # with one down, the rest carry the fleet
    return Plan(
        gateways=gateways,
        routers=routers,
        gateway_mib_each=costs.gateway_base_mib + collectors / serving * costs.gateway_mib_per_collector,
        gateway_core_share=gateway_load / serving,
        router_core_share=router_load / (routers - 1),
        postgres_cores=tasks_per_s * costs.postgres_ms_per_task / 1000,
        statements_per_s=tasks_per_s * costs.statements_per_task + claims_per_s * STATEMENTS_PER_IDLE_CLAIM,
        transactions_per_s=tasks_per_s * costs.transactions_per_task,
        claims_per_s=claims_per_s,
        redis_cores=tasks_per_s * costs.redis_ms_per_task / 1000,
    )


def markdown(costs: Costs, rows: list[tuple[int, float, Plan]]) -> str:
    lines = [
        "| Collectors | Tasks/s | Gateways (N+1) | RSS per gateway | Core per gateway | Routers (N+1) "
        "| Core per router | Claims/s | PostgreSQL CPU (tasks) | Statements/s | Commits/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for collectors, rate, p in rows:
        lines.append(
            f"| {collectors:,} | {rate:,.0f} | {p.gateways} | {p.gateway_mib_each:,.0f} MiB "
            f"| {p.gateway_core_share:.2f} | {p.routers} | {p.router_core_share:.2f} | {p.claims_per_s:,.0f} "
            f"| {p.postgres_cores:.2f} cores | {p.statements_per_s:,.0f} | {p.transactions_per_s:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--collectors", type=int, action="append")
    parser.add_argument("--tasks-per-s", type=float, action="append")
    parser.add_argument("--utilization", type=float, default=0.7)
    args = parser.parse_args()
    costs = load_costs()
    fleets = args.collectors or [10_000, 100_000]
    rates = args.tasks_per_s or [50.0, 500.0]
    rows = [(c, r, plan(costs, c, r, args.utilization)) for c in fleets for r in rates]
    print(f"costs measured at {costs.measured_fleet:,} idle collectors and single-task throughput:")
    print(json.dumps(dataclasses.asdict(costs), indent=2))
    print(markdown(costs, rows))


if __name__ == "__main__":
    main()
