"""Key material across router processes on one database (issue 25): a second router with keys of its
own refuses to start; shared material reaches a replica and a rotation follows it, without a restart."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.harness import run_cli, service_env, wait_grpc_serving

pytestmark = pytest.mark.timeout(180)


def _router(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "versus_cp", "router"], env=env, stdout=out, stderr=subprocess.STDOUT
        )


def _refused(env: dict[str, str], log: Path) -> str:
    proc = _router(env, log)
    assert proc.wait(60) == 2, log.read_text()  # EXIT_CONFIG: systemd's units do not restart it
    return log.read_text()


def _kids(state: Path) -> list[str]:
    meta = json.loads((state / "keys" / "dispatch" / "keyset.json").read_text())
    return [k["kid"] for k in meta["keys"]]


def test_replicas_share_one_material_or_refuse_to_start(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    backends = {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
    first_env = service_env(tmp_path / "a", **backends)
    first = _router(first_env, tmp_path / "a.log")
    procs = [first]
    try:
        wait_grpc_serving(int(first_env["VERSUS_ROUTER_PORT"]), first, tmp_path / "a.log")

        # Another host's router with a state directory of its own: refused, with what to do.
        said = _refused(service_env(tmp_path / "b", **backends), tmp_path / "b-local.log")
        assert "is not the deployment's" in said and "versus-cp material share" in said
        assert not (tmp_path / "b" / "keys").exists()  # it minted nothing

        key = tmp_path / "material.key"
        assert run_cli(["material", "new-key", str(key)], first_env).returncode == 0
        shared = {"VERSUS_KEY_MATERIAL": "shared", "VERSUS_MATERIAL_KEY_FILE": str(key)}
        done = run_cli(["material", "share"], {**first_env, **shared})
        assert done.returncode == 0, done.stderr

        # Shared, but without the material key.
        said = _refused(
            service_env(tmp_path / "c", **backends, VERSUS_KEY_MATERIAL="shared"), tmp_path / "c.log"
        )
        assert "needs VERSUS_MATERIAL_KEY_FILE" in said

        replica_env = service_env(tmp_path / "b", **backends, **shared, VERSUS_ROUTER_ADVERTISE="127.0.0.1:1")
        replica_env["VERSUS_ROUTER_ADVERTISE"] = f"127.0.0.1:{replica_env['VERSUS_ROUTER_PORT']}"
        replica = _router(replica_env, tmp_path / "b.log")
        procs.append(replica)
        wait_grpc_serving(int(replica_env["VERSUS_ROUTER_PORT"]), replica, tmp_path / "b.log")
        assert _kids(tmp_path / "b") == _kids(tmp_path / "a")

        # A rotation made from a third host reaches the running replica within its follow interval.
        operator_env = service_env(tmp_path / "ops", **backends, **shared)
        done = run_cli(["keys", "rotate", "--set", "dispatch", "--grace", "0s"], operator_env)
        assert done.returncode == 0, done.stderr
        rotated = _kids(tmp_path / "ops")
        assert len(rotated) == len(_kids(tmp_path / "a")) + 1
        deadline = time.monotonic() + 20
        while _kids(tmp_path / "b") != rotated:
            assert time.monotonic() < deadline, "the replica did not follow the rotation"
            time.sleep(0.2)
        status = run_cli(["material", "status", "--json"], operator_env)
        assert json.loads(status.stdout)["mode"] == "shared"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
