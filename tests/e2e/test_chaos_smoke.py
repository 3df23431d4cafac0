"""A short seeded chaos run (`make chaos` runs the long one): faults land, no promise breaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.run import Config, run

pytestmark = pytest.mark.timeout(420)
# The faults that found bugs before, injected in this order so every run covers them.
SMOKE = (
    "postgres_restart",
    "collector_sigkill_holder",
    "connection_drop",
    "gateway_restart",
    "router_restart",
)


def test_faults_break_no_promise(tmp_path: Path) -> None:
    config = Config(
        seed=7,
        seconds=30,
        rate=3,
        fault_every=5,
        collectors=3,
        devices=4,
        deadline=40,
        faults=",".join(SMOKE),
    )
    report = run(config, tmp_path / "chaos")
    print(report.render())  # noqa: T201 - the summary is the useful part of a failure
    accepted = sum(n for state, n in report.tasks.items() if state in ("success", "failed", "indeterminate"))
    assert accepted >= 30, report.render()
    assert sum(report.faults.values()) >= 3, report.render()
    assert report.faults["postgres_restart"] >= 1, report.render()
    assert report.violations == [], report.render()
