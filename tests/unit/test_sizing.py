"""The sizing calculation behind docs/deployment.md: costs in, processes out (N+1, under a core each)."""

from __future__ import annotations

import pytest

from bench.sizing import Costs, load_costs, plan

pytestmark = pytest.mark.timeout(10)

COSTS = Costs(
    gateway_mib_per_collector=0.1, gateway_base_mib=100, gateway_cores_per_collector=5e-5,
    router_cores_per_collector=7e-5, router_ms_per_task=10, gateway_ms_per_task=5,
    postgres_ms_per_task=1, redis_ms_per_task=1, statements_per_task=13, transactions_per_task=4,
    measured_fleet=10_000,
)  # fmt: skip


def test_each_kind_gets_enough_processes_under_the_utilization_and_one_spare() -> None:
    p = plan(COSTS, collectors=100_000, tasks_per_s=100, utilization=0.5)
    # gateways: 100k * 5e-5 = 5 cores + 100 * 5 ms = 0.5 -> 5.5 / 0.5 = 11, + 1 spare
    assert p.gateways == 12 and p.gateway_core_share == pytest.approx(0.5)
    # routers: 7 + 1 = 8 cores -> 16, + 1
    assert p.routers == 17 and p.router_core_share == pytest.approx(0.5)
    assert p.gateway_mib_each == pytest.approx(100 + 100_000 / 11 * 0.1)
    assert p.claims_per_s == 4000 and p.statements_per_s == 100 * 13 + 4000 * 2
    assert p.postgres_cores == pytest.approx(0.1) and p.transactions_per_s == 400


def test_the_recorded_benchmark_results_load() -> None:
    costs = load_costs()
    assert (
        costs.measured_fleet >= 1000 and costs.router_ms_per_task > 0 and costs.gateway_mib_per_collector > 0
    )
