"""Each service runs alone against external PostgreSQL and Redis, and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.access.rbac import Role
from tests.e2e.harness import service_env
from tests.support.access import mint_at

pytestmark = pytest.mark.timeout(120)


def _wait_until(check: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"service exited with {proc.returncode}"
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("service not ready in time")


def _grpc_serving(port: int, service: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=1
                )
                return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
        except grpc.RpcError:
            return False

    return check


def _start(command: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "versus_cp", command], env=env, stdout=fh, stderr=fh)


@pytest.mark.parametrize(
    ("command", "port_var", "service"),
    [
        ("router", "VERSUS_ROUTER_PORT", "versus.router.v1.TaskRouterService"),
        ("enrollment", "VERSUS_ENROLLMENT_PORT", "versus.enrollment.v1.EnrollmentService"),
    ],
)
def test_grpc_service_alone(
    tmp_path: Path, database_url: str, redis_url: str, command: str, port_var: str, service: str
) -> None:
    env = service_env(tmp_path / "state", DATABASE_URL=database_url, REDIS_URL=redis_url)
    proc = _start(command, env, tmp_path / "service.log")
    try:
        _wait_until(_grpc_serving(int(env[port_var]), service), proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopping" in (tmp_path / "service.log").read_text()


def test_gateway_alone(tmp_path: Path, database_url: str, redis_url: str) -> None:
    token = asyncio.run(mint_at(database_url, Role.SERVICE))
    env = service_env(
        tmp_path / "state",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        VERSUS_LOG_FORMAT="json",
        VERSUS_SERVICE_TOKEN=token,
    )
    proc = _start("gateway", env, tmp_path / "gateway.log")
    url = f"https://127.0.0.1:{env['VERSUS_GATEWAY_PORT']}/readyz"
    ca = tmp_path / "state" / "tls" / "gateway-ca.pem"

    def ready() -> bool:
        if not ca.exists():
            return False
        try:
            return httpx.get(url, verify=ssl.create_default_context(cafile=ca), timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait_until(ready, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # JSON logs: every line is one object.
    lines = (tmp_path / "gateway.log").read_text().strip().splitlines()
    assert lines
    assert all(line.startswith("{") and line.endswith("}") for line in lines)


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("command", ["router", "enrollment", "gateway"])
def test_sigterm_at_any_instant_of_start_up_exits_0(
    tmp_path: Path, database_url: str, redis_url: str, command: str
) -> None:
    """From its first handler on (the entry point's first statements), a stop signal at any moment
    of start-up stops the service cleanly, within its grace period."""
    token = asyncio.run(mint_at(database_url, Role.SERVICE))
    env = service_env(tmp_path / "state", DATABASE_URL=database_url, REDIS_URL=redis_url,
                      VERSUS_SERVICE_TOKEN=token)  # fmt: skip
    grace = float(env["VERSUS_SHUTDOWN_GRACE_S"])
    moments: list[float | str] = [0.6, 1.5, "serving"]
    for n, moment in enumerate(moments):
        log = tmp_path / f"{command}-{n}.log"
        proc = _start(command, env, log)
        spawned = time.monotonic()

        def serving(path: Path = log) -> bool:
            return "serving" in path.read_text()

        try:
            if isinstance(moment, str):
                _wait_until(serving, proc)
                time.sleep(0.01)
            else:
                time.sleep(max(moment - (time.monotonic() - spawned), 0))
            # Python itself takes a few tens of milliseconds to start; from then on the signal is caught.
            assert _catches_sigterm(proc.pid), f"no SIGTERM handler {moment} s after start"
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(grace + 10)
            assert code == 0, f"SIGTERM {moment} s into start-up: exit {code}\n{log.read_text()[-2000:]}"
            assert time.monotonic() - started < grace + 5
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
