"""Start `versus-cp` as a real process tree on free ports and talk to it over sockets."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import psutil
import pytest

from common.embedded.process import free_ports
from tests.e2e.operator_api import OperatorApi

BANNER = "Versus control plane is up."


def service_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for a control plane on its own state directory and free ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERSUS_", "DATABASE_URL", "REDIS_URL"))}
    gateway, router, router_metrics, enrollment, enrollment_metrics, console = free_ports(6)
    env.update(
        {
            "VERSUS_STATE_DIR": str(state_dir),
            "VERSUS_GATEWAY_PORT": str(gateway),
            "VERSUS_ROUTER_PORT": str(router),
            "VERSUS_ROUTER_METRICS_PORT": str(router_metrics),
            "VERSUS_ENROLLMENT_PORT": str(enrollment),
            "VERSUS_ENROLLMENT_METRICS_PORT": str(enrollment_metrics),
            "VERSUS_CONSOLE_PORT": str(console),
            "VERSUS_SHUTDOWN_GRACE_S": "5",
        }
    )
    env.update(extra)
    return env


def wait_grpc_serving(
    port: int, proc: subprocess.Popen[bytes], log: Path | None = None, host: str = "127.0.0.1"
) -> None:
    """Until the gRPC service on ``port`` answers its health check SERVING (60 s at most); fails
    at once, with its log, if ``proc`` exits first."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def said() -> str:
        return log.read_text(errors="replace") if log is not None else ""

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the service exited during startup\n" + said()
        try:
            with grpc.insecure_channel(f"{host}:{port}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise AssertionError("the service is not serving\n" + said())


# Operator commands that only read from the running services (or the state directory's key files)
# run in the test's own process: the same `versus-cp` main, environment, output and exit status,
# without a Python process each (about 0.35 CPU-s, and the suite runs hundreds). Anything that
# changes state, starts a server, or writes files runs as a real process, as an operator would.
READ_ONLY_COMMANDS = frozenset({
    ("collectors", "list"), ("collectors", "show"), ("sites", "list"), ("tokens", "list"),
    ("audit", "list"), ("releases", "list"), ("keys", "list"), ("keys", "status"), ("tasks", "get"),
    ("tasks", "list"), ("queue", "list"), ("queue", "show"), ("vault-integrations", "list"),
    ("access", "list"), ("access", "whoami"),
})  # fmt: skip


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "versus_cp", *args]
    if tuple(args[:2]) in READ_ONLY_COMMANDS:
        return _run_here(argv, args, env)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _run_here(argv: list[str], args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    from versus_cp.main import main

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), redirect_stdout(out), redirect_stderr(err):
        try:
            status = main(args)
        except SystemExit as exc:  # argparse's usage errors and --help
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


@dataclass
class ControlPlane:
    """A running `versus-cp up`."""

    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] = field(init=False)
    _api: OperatorApi | None = field(default=None, init=False, repr=False)

    def start(self, timeout: float = 90) -> ControlPlane:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "versus_cp", "up"],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if BANNER in self.log():
                return self
            if self.proc.poll() is not None:
                self._log.close()
                raise AssertionError(f"versus-cp up exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        self.proc.kill()
        self.wait()
        raise AssertionError(f"versus-cp up not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_mark(self) -> int:
        """Where the log ends now: ``log_since`` of it is what the processes wrote after."""
        return self.log_path.stat().st_size

    def log_since(self, mark: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(mark)
            return log.read().decode(errors="replace")

    @property
    def state_dir(self) -> Path:
        return Path(self.env["VERSUS_STATE_DIR"])

    def port(self, name: str) -> int:
        return int(self.env[f"VERSUS_{name.upper()}_PORT"])

    @property
    def gateway_url(self) -> str:
        return f"https://127.0.0.1:{self.port('gateway')}"

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "tls" / "gateway-ca.pem"

    @property
    def api(self) -> OperatorApi:
        """The operator's gRPC API as this control plane's admin, in this process (for set-up and
        polling; a test of the CLI runs ``run_cli``)."""
        if self._api is None:
            self._api = OperatorApi(
                f"127.0.0.1:{self.port('enrollment')}", f"127.0.0.1:{self.port('router')}", self.admin_token
            )
        return self._api

    def mint_token(self, role: str, name: str | None = None, tenants: tuple[str, ...] = ()) -> str:
        """A new API token with ``role`` (as `versus-cp access create` makes one, with the admin token).

        A platform token acts for ``tenants``, or for every tenant when none are named.
        """
        return self.api.create_api_token(name or f"e2e-{role}", role, tenants)

    @property
    def admin_token(self) -> str:
        return (self.state_dir / "admin-token").read_text().strip()

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if not self._log.closed:
                self._log.close()
            if self._api is not None:
                self._api.close()
                self._api = None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        return self.wait()


def wait_gone(processes: list[psutil.Process], timeout: float = 30) -> list[psutil.Process]:
    """Processes still running after ``timeout`` (zombies count as gone)."""
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def control_plane_for(
    tmp_path_factory: pytest.TempPathFactory, name: str, **env: str
) -> Iterator[ControlPlane]:
    """A `versus-cp up` for a broader fixture scope than one test (stopped at its end)."""
    root = tmp_path_factory.mktemp(name)
    plane = ControlPlane(service_env(root / "state", **env), root / "up.log").start()
    yield plane
    if plane.proc.poll() is None:
        plane.stop()
