"""A short seeded chaos run (`make chaos` runs the long one): faults land, no promise breaks."""

from __future__ import annotations

import json
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
    root = tmp_path / "chaos"
    report = run(config, root)
    print(report.render())  # noqa: T201 - the summary is the useful part of a failure
    accepted = sum(n for state, n in report.tasks.items() if state in ("success", "failed", "indeterminate"))
    assert accepted >= 30, report.render()
    assert sum(report.faults.values()) >= 3, report.render()
    assert report.faults["postgres_restart"] >= 1, report.render()
    # The services' logs go with the run's temporary directory: a failure carries what they warned of.
    assert report.violations == [], report.render() + _warnings(root)


def _warnings(root: Path, per_service: int = 25) -> str:
    """The last warnings and errors each service logged (JSON lines), with their time."""
    out = []
    for name in ("router", "gateway", "enrollment", "up"):
        path = root / f"{name}.log"
        lines = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("level") in ("warning", "error", "critical"):
                details = {
                    k: v for k, v in record.items() if k not in ("level", "logger", "service", "timestamp")
                }
                lines.append(f"  {record.get('timestamp', '?')} {record['level']} {details}")
        out.append(
            f"\n{name}: {len(lines)} warnings and errors, the last {per_service}:\n"
            + "\n".join(lines[-per_service:])
        )
    return "".join(out)
