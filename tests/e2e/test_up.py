"""`versus-cp up` as an operator runs it: real processes, real sockets, real TLS."""

from __future__ import annotations

import shutil
import signal
import ssl
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import psycopg
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.embedded.postgres import EmbeddedPostgres
from common.embedded.process import free_port
from common.embedded.redis import EmbeddedRedis
from tests.e2e.harness import ControlPlane, run_cli, wait_gone

pytestmark = pytest.mark.timeout(180)

ROUTER_SERVICES = (
    "versus.router.v1.TaskRouterService",
    "versus.router.v1.CollectorBridgeService",
    "versus.fleet.v1.FleetService",
)
ENROLLMENT_SERVICES = ("versus.enrollment.v1.EnrollmentService",)


def _health(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(reply.status)


def _readyz(cp: ControlPlane) -> httpx.Response:
    return httpx.get(
        f"{cp.gateway_url}/readyz", verify=ssl.create_default_context(cafile=cp.ca_file), timeout=10
    )


@pytest.fixture
def short_state() -> Iterator[Path]:
    """A state directory short enough that the embedded servers keep their sockets inside it (a
    long one, such as a parallel worker's tmp_path, makes them fall back to a private /tmp dir)."""
    path = Path(tempfile.mkdtemp(prefix="vs-up-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _embedded_db_url(state: Path) -> str:
    return f"postgresql://postgres@/versus?host={state / 'postgres' / 'run'}&port=5432"


def test_up_serves_every_service_and_sigterm_stops_everything(
    start_control_plane: Callable[..., ControlPlane],
) -> None:
    cp = start_control_plane()
    for service in ("", *ROUTER_SERVICES):
        assert _health(cp.port("router"), service) == health_pb2.HealthCheckResponse.SERVING
    for service in ("", *ENROLLMENT_SERVICES):
        assert _health(cp.port("enrollment"), service) == health_pb2.HealthCheckResponse.SERVING
    ready = _readyz(cp)
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"postgres": "ok", "redis": "ok"}
    metrics = httpx.get(f"http://127.0.0.1:{cp.port('router_metrics')}/metrics", timeout=5)
    assert 'versus_service_up{service="router"} 1.0' in metrics.text

    tree = cp.descendants()
    names = " ".join(" ".join(p.cmdline()) for p in tree)
    for expected in (
        "versus_cp router",
        "versus_cp enrollment",
        "versus_cp gateway",
        "redis-server",
        "postgres",
    ):
        assert expected in names
    cp.signal(signal.SIGTERM)
    assert cp.wait(60) == 0
    assert wait_gone(tree, timeout=10) == []
    assert "embedded postgres stopped" in cp.log()


def test_up_keeps_data_across_restarts(
    start_control_plane: Callable[..., ControlPlane], short_state: Path
) -> None:
    state = short_state
    cp = start_control_plane(state)
    with psycopg.connect(_embedded_db_url(state)) as conn:
        conn.execute(
            "INSERT INTO audit_events (service, actor, action, subject_type, subject_id) "
            "VALUES ('test', 'tester', 'kept', 'test', 'row-1')"
        )
    client = redis.Redis.from_url(f"unix://{state / 'redis' / 'redis.sock'}")
    client.set("kept", "1")
    client.close()
    # The bootstrap admin token is shown once, on the first start, and kept 0600 for `versus-cp`.
    token = (state / "admin-token").read_text().strip()
    assert token.startswith("vsk_") and (state / "admin-token").stat().st_mode & 0o777 == 0o600
    assert cp.log().count(token) == 1
    assert cp.stop() == 0

    cp = start_control_plane(state)
    assert "Bootstrap admin API token" not in cp.log()
    assert (state / "admin-token").read_text().strip() == token
    whoami = run_cli(["access", "whoami"], cp.env)
    assert whoami.stdout.strip().startswith("bootstrap-admin (tok_") and "collector-admin" in whoami.stdout
    with psycopg.connect(_embedded_db_url(state)) as conn:
        assert conn.execute("SELECT action FROM audit_events WHERE subject_id = 'row-1'").fetchone() == (
            "kept",
        )
    client = redis.Redis.from_url(f"unix://{state / 'redis' / 'redis.sock'}")
    assert client.get("kept") == b"1"
    client.close()
    assert cp.stop() == 0


def test_up_uses_external_servers_when_urls_are_set(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    with (
        EmbeddedPostgres(tmp_path / "other-pg", port=free_port()) as pg,
        EmbeddedRedis(tmp_path / "other-redis", port=free_port()) as rd,
    ):
        state = tmp_path / "state"
        cp = start_control_plane(state, DATABASE_URL=pg.url, REDIS_URL=rd.url)
        assert _readyz(cp).status_code == 200
        # Nothing embedded was started under the state directory...
        assert not (state / "postgres").exists()
        assert not (state / "redis").exists()
        command_lines = " ".join(" ".join(p.cmdline()) for p in cp.descendants())
        assert "redis-server" not in command_lines
        # Credentials travel in the environment, never on a command line other users can read.
        assert pg.url.split(":")[2].split("@")[0] not in command_lines
        # ...and the external servers are the ones in use.
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone() is not None
        client = redis.Redis.from_url(rd.url)
        clients = client.client_list()
        client.close()
        assert len(clients) > 1
        assert cp.stop() == 0


def test_sigkill_of_the_supervisor_leaves_no_orphans(
    start_control_plane: Callable[..., ControlPlane],
) -> None:
    cp = start_control_plane()
    tree = cp.descendants()
    assert len(tree) >= 5
    cp.signal(signal.SIGKILL)
    cp.wait(10)
    assert wait_gone(tree, timeout=30) == []


def test_a_crashed_service_takes_the_control_plane_down(
    start_control_plane: Callable[..., ControlPlane],
) -> None:
    cp = start_control_plane()
    router = next(p for p in cp.descendants() if "versus_cp router" in " ".join(p.cmdline()))
    tree = cp.descendants()
    router.kill()
    assert cp.wait(60) == 1
    assert "service exited unexpectedly" in cp.log()
    assert wait_gone(tree, timeout=10) == []


def test_two_up_processes_cannot_share_a_state_directory(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    state = tmp_path / "shared"
    start_control_plane(state)
    with pytest.raises(AssertionError, match="is in use by pid"):
        start_control_plane(state)
