"""The disaster-recovery drill (issue 42): a deployment is backed up with `versus-cp backup create`,
keeps working, then loses its host whole (processes killed, state directory and database gone).
`versus-cp backup restore` on a fresh state directory and a new PostgreSQL, then `versus-cp up`,
brings it back; the collector enrolled before the backup takes work again without enrolling
again. What the backup could not hold (RPO) and how long recovery took (RTO) are printed."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import grpc
import pytest

from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane, run_cli, service_env, wait_gone

pytestmark = pytest.mark.timeout(300)


def _ok(done: object) -> dict[str, object]:
    assert getattr(done, "returncode", 1) == 0, getattr(done, "stderr", "")
    result: dict[str, object] = json.loads(getattr(done, "stdout", ""))
    return result


def test_a_restore_on_fresh_hosts_brings_the_fleet_back_without_enrolling(
    start_control_plane: object, tmp_path: Path
) -> None:
    old: ControlPlane = start_control_plane()  # type: ignore[operator]
    key = tmp_path / "material.key"  # kept apart from the backups, as the operator keeps it
    assert run_cli(["material", "new-key", str(key)], old.env).returncode == 0
    collector = Collector(old, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    identity = (collector.state / "identity.json").read_bytes()
    collector.start()
    platform = Platform(old)
    before = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": 1}, "dr-before")
    platform.wait_state(before, {"success"})

    backup = tmp_path / "backups" / "versus.tar"
    backup.parent.mkdir()
    made = _ok(run_cli(["backup", "create", str(backup), "--material-key", str(key), "--json"], old.env))
    backed_up = time.monotonic()
    assert made["material_mode"] == "local" and backup.stat().st_mode & 0o777 == 0o600
    verified = run_cli(["backup", "verify", str(backup), "--material-key", str(key)], old.env)
    assert verified.returncode == 0, verified.stderr
    after = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": 2}, "dr-after")
    platform.wait_state(after, {"success"})  # acknowledged after the backup: what an RPO loses
    platform.close()
    admin_token = old.admin_token  # the operator's own token, kept by the operator

    # The disaster: the host is gone, processes, state directory and database with it.
    children = old.descendants()
    old.proc.kill()
    old.wait()
    assert wait_gone(children) == []
    disaster = time.monotonic()
    shutil.rmtree(old.state_dir)

    # Fresh hosts: a new state directory and a new PostgreSQL; the gateway at the same address
    # (the name collectors were enrolled with).
    env = service_env(tmp_path / "restored", VERSUS_GATEWAY_PORT=old.env["VERSUS_GATEWAY_PORT"])
    restored = _ok(run_cli(["backup", "restore", str(backup), "--material-key", str(key), "--json"], env))
    assert restored["material_id"] == made["material_id"]
    (tmp_path / "restored" / "admin-token").write_text(admin_token + "\n")
    new = ControlPlane(env, tmp_path / "up-restored.log").start()
    try:
        platform = Platform(new)
        collector.cp = new
        work = platform.submit(collector.site_id, "echo", "read", "dev-1", {"n": 3}, "dr-restored")
        platform.wait_state(work, {"success"}, timeout=120)
        recovered = time.monotonic()

        assert platform.wait_state(before, {"success"}, timeout=5)  # in the backup: kept
        with pytest.raises(grpc.RpcError) as lost:
            platform.task(after)  # after the backup: lost, as the RPO says
        assert lost.value.code() == grpc.StatusCode.NOT_FOUND
        assert (collector.state / "identity.json").read_bytes() == identity  # never enrolled again
        assert new.api.collector(collector_id)["status"].endswith("ACTIVE")
        rpo, rto = disaster - backed_up, recovered - disaster
        print(  # noqa: T201 - the drill's measures
            f"RPO: {rpo:.1f} s of work after the backup (1 acknowledged task lost); "
            f"RTO: {rto:.1f} s from the disaster to a task done on the restored hosts "
            f"(restore {float(str(restored['seconds'])):.1f} s)"
        )
        platform.close()
    finally:
        collector.stop()
        new.stop()
