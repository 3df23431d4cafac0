from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import ControlPlane, service_env


@pytest.fixture(scope="module")
def shared_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One `versus-cp up` for the tests of a module that ask for it (about 11 CPU-seconds and
    5 s saved per test). Tests sharing it keep to their own sites, collectors and devices, leave
    its settings and processes alone, and read only what they caused (``ControlPlane.log_since``)."""
    root = tmp_path_factory.mktemp("shared-control-plane")
    plane = ControlPlane(service_env(root / "state"), root / "up.log").start()
    yield plane
    if plane.proc.poll() is None:
        plane.stop()


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
