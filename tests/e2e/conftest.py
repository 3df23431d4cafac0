from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import ControlPlane, control_plane_for, service_env
from tests.support.schedule import balanced, load_durations, units_of

# Recorded durations of this suite's tests (``make e2e-durations``): the workers' order follows them.
DURATIONS = Path(__file__).with_name("durations.json")
_recorded: defaultdict[str, float] = defaultdict(float)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        items[:] = balanced(units_of(items, load_durations(DURATIONS)), workers)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Setup, call and teardown together: a test's fixtures are its cost too.
    _recorded[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("VERSUS_RECORD_DURATIONS")
    if out and not os.environ.get("PYTEST_XDIST_WORKER") and _recorded:
        ordered = {k: round(v, 1) for k, v in sorted(_recorded.items())}
        Path(out).write_text(json.dumps(ordered, indent=1) + "\n")


@pytest.fixture(scope="session")
def shared_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One `versus-cp up` for every test (of this worker) that asks for it, instead of one each:
    a control plane costs about 11 CPU-seconds and 5 s to start. Tests sharing it keep to their
    own sites, collectors, devices and idempotency keys, count nothing fleet-wide, leave its
    settings, processes and backends alone, and read only the log they caused
    (``ControlPlane.log_since``). A module whose tests need more isolation among themselves than
    from the rest makes its own (``control_plane_for``)."""
    # The fleet gauges sampled every 2 s, not 15: a test reading them waits less (test_prometheus.py).
    yield from control_plane_for(tmp_path_factory, "shared-control-plane", VERSUS_ROUTER_FLEET_SAMPLE_S="2")


@pytest.fixture(scope="session")
def release_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's collector releases are built once (tests/e2e/upgrade_harness.py): the
    directory above each xdist worker's own, so every worker of the session shares it."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "releases"


@pytest.fixture
def start_control_plane(tmp_path: Path) -> Iterator[Callable[..., ControlPlane]]:
    """Start `versus-cp up`; anything still running at the end of the test is stopped."""
    started: list[ControlPlane] = []

    def start(state_dir: Path | None = None, **env: str) -> ControlPlane:
        state = state_dir or tmp_path / f"state{len(started)}"
        cp = ControlPlane(service_env(state, **env), tmp_path / f"up{len(started)}.log")
        started.append(cp)
        return cp.start()

    yield start
    for cp in started:
        if cp.proc.poll() is None:
            cp.proc.kill()
            cp.wait()
