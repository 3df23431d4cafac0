from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import ControlPlane, control_plane_for, service_env


@pytest.fixture(scope="session")
def shared_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One `versus-cp up` for every test (of this worker) that asks for it, instead of one each:
    a control plane costs about 11 CPU-seconds and 5 s to start. Tests sharing it keep to their
    own sites, collectors, devices and idempotency keys, count nothing fleet-wide, leave its
    settings, processes and backends alone, and read only the log they caused
    (``ControlPlane.log_since``). A module whose tests need more isolation among themselves than
    from the rest makes its own (``control_plane_for``)."""
    yield from control_plane_for(tmp_path_factory, "shared-control-plane")


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
