"""The system under fault injection: every part a separate process that can be killed.

PostgreSQL and Redis are embedded servers started here (so they can be
restarted and flushed); `versus-cp up` runs once to initialise the state
directory (keys, CAs, TLS, migrations, service token), then the router,
enrollment service and gateway run as the standalone services they are in a
scaled-out deployment, so each can be killed and restarted on its own. The
collectors are real `versus-collector run` processes sharing one directory of
stub devices (collector/drivers/stub.py), as real devices are reachable from
every collector of a site.
"""

from __future__ import annotations

import json
import shlex
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis import Redis

from collector.drivers.stub import DEVICE_DIR_ENV
from collector.state import StatePaths, read_json
from common.embedded.postgres import EmbeddedPostgres
from common.embedded.redis import EmbeddedRedis
from tests.e2e.harness import BANNER, service_env
from tests.support.data_tier import DataTier
from tests.support.sentinel import SentinelGroup
from tests.support.tcp_proxy import CuttableProxy

SERVICES = ("router", "enrollment", "gateway")


@dataclass
class Proc:
    """One child process with its log, restartable with the same command."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)
    stopped: bool = False  # SIGSTOPped

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log, stderr=self._log)
        self.stopped = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)
            self.stopped = sig == signal.SIGSTOP

    def kill(self) -> None:
        if self.proc is not None:
            if self.stopped:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(30)
        self._reap()

    def terminate(self, timeout: float = 30) -> None:
        if self.running:
            assert self.proc is not None
            if self.stopped:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reap()

    def exited(self) -> str:
        """Why this process is not running when it should be ('' while it runs): its exit status
        and the last line it wrote."""
        if self.proc is None or self.proc.poll() is None:
            return ""
        lines = (
            self.log_path.read_text(errors="replace").strip().splitlines() if self.log_path.exists() else []
        )
        return f"{self.name} exited with status {self.proc.returncode}: {lines[-1][:300] if lines else ''}"

    def _reap(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def serving(port: str) -> bool:
    """The gRPC server on ``port`` answers its overall health check SERVING."""
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass
class ChaosStack:
    root: Path
    # The data tier of deploy/ (Patroni + etcd, Redis Sentinel) instead of one embedded server of
    # each: the failover drill (chaos/ha.py).
    ha: bool = False
    postgres: EmbeddedPostgres | DataTier = field(init=False)
    redis: EmbeddedRedis | SentinelGroup = field(init=False)
    env: dict[str, str] = field(init=False)
    services: dict[str, Proc] = field(default_factory=dict)
    collectors: list[Proc] = field(default_factory=list)
    site_id: str = ""
    proxy: CuttableProxy = field(init=False)
    # Each collector's process by its enrolled id (faults aimed at the holder of a dispatch).
    by_collector_id: dict[str, Proc] = field(default_factory=dict)

    @property
    def devices(self) -> Path:
        return self.root / "devices"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def embedded(self) -> tuple[EmbeddedPostgres, EmbeddedRedis]:
        """The embedded servers (the restart and flush faults); not in the HA drill."""
        assert isinstance(self.postgres, EmbeddedPostgres) and isinstance(self.redis, EmbeddedRedis)
        return self.postgres, self.redis

    @property
    def tier(self) -> DataTier:
        assert isinstance(self.postgres, DataTier), "the HA drill's stack only"
        return self.postgres

    @property
    def sentinels(self) -> SentinelGroup:
        assert isinstance(self.redis, SentinelGroup), "the HA drill's stack only"
        return self.redis

    def start(self, collectors: int, claim_hold_s: int = 5) -> None:
        if self.ha:
            (self.root / "pg").mkdir(parents=True)
            (self.root / "redis").mkdir()
            self.postgres = DataTier(self.root / "pg").start()
            self.redis = SentinelGroup(self.root / "redis").start()
        else:
            self.postgres = EmbeddedPostgres(self.root / "pg").start()
            self.redis = EmbeddedRedis(self.root / "redis").start()
        self.devices.mkdir(parents=True, exist_ok=True)
        self.env = service_env(
            self.state_dir,
            DATABASE_URL=self.postgres.url,
            REDIS_URL=self.redis.url,
            VERSUS_LOG_FORMAT="json",
            VERSUS_CLAIM_HOLD_S=str(claim_hold_s),
            VERSUS_SHUTDOWN_GRACE_S="3",
        )
        self._initialise()
        self.env["VERSUS_SERVICE_TOKEN"] = (self.state_dir / "service-token").read_text().strip()
        for name in SERVICES:
            self.services[name] = Proc(
                name, [sys.executable, "-m", "versus_cp", name], self.env, self.root / f"{name}.log"
            )
            self.services[name].start()
        self.wait_ready()
        self._enroll(collectors)

    def _initialise(self) -> None:
        """One `versus-cp up` against the servers: keys, CAs, TLS, migrations, tokens."""
        up = Proc("up", [sys.executable, "-m", "versus_cp", "up"], self.env, self.root / "up.log")
        up.start()
        deadline = time.monotonic() + 120
        while BANNER not in up.log_path.read_text(errors="replace"):
            if not up.running or time.monotonic() > deadline:
                up.kill()
                raise RuntimeError("versus-cp up did not start:\n" + up.log_path.read_text(errors="replace"))
            time.sleep(0.2)
        up.terminate()

    def cli(self, *args: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "versus_cp", *args, "--json"],
            env=self.env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"versus-cp {' '.join(args)}: {done.stderr}")
        result: dict[str, object] = json.loads(done.stdout)
        return result

    def wait_ready(self, timeout: float = 60) -> None:
        """Until every service serves: the router's and the enrollment service's gRPC health checks
        answer SERVING and the gateway's readiness passes. A restart fault ends here, so this must
        see the restarted service itself: it once asked `versus-cp sites list` (the enrollment
        service) and the gateway, never the router, and under load a router still importing 5-8 s
        later made its refusals look like errors outside any fault (chaos smoke, CPU hog)."""
        deadline = time.monotonic() + timeout
        gateway = f"https://127.0.0.1:{self.env['VERSUS_GATEWAY_PORT']}/readyz"
        context = ssl.create_default_context(cafile=self.state_dir / "tls" / "gateway-ca.pem")
        grpc_ports = (self.env["VERSUS_ROUTER_PORT"], self.env["VERSUS_ENROLLMENT_PORT"])
        with httpx.Client(verify=context, timeout=2) as client:
            while time.monotonic() < deadline:
                try:
                    ready = client.get(gateway).status_code == 200
                except (httpx.HTTPError, OSError):
                    ready = False
                if ready and all(serving(port) for port in grpc_ports):
                    return
                time.sleep(0.25)
        raise RuntimeError("control plane not ready")

    def _enroll(self, count: int) -> None:
        site = self.cli("sites", "create", "chaos-site", "--tenant", "chaos")["site"]
        assert isinstance(site, dict)
        self.site_id = str(site["site_id"])
        issued = self.cli("tokens", "issue", "--site", self.site_id, "--max-uses", str(count))
        command = shlex.split(str(issued["enroll_command"]))[1:]
        # Collectors reach the gateway through a proxy whose connections a fault can cut.
        self.proxy = CuttableProxy(int(self.env["VERSUS_GATEWAY_PORT"]))
        url = command.index("--url") + 1
        command[url] = command[url].replace(f":{self.env['VERSUS_GATEWAY_PORT']}", f":{self.proxy.port}")
        env = {**self.env, DEVICE_DIR_ENV: str(self.devices)}
        for i in range(count):
            state = self.root / f"collector-{i}"
            done = subprocess.run(
                [sys.executable, "-m", "collector", *command, "--state-dir", str(state)],
                input=str(issued["plaintext"]) + "\n", env=env, capture_output=True, text=True, timeout=60,
                check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"enrolling collector {i}: {done.stderr}")
            argv = [
                sys.executable, "-m", "collector", "run", "--state-dir", str(state),
                "--claim-wait", "2", "--grace", "5", "--max-backoff", "1",
            ]  # fmt: skip
            proc = Proc(f"collector-{i}", argv, env, self.root / f"collector-{i}.log")
            proc.start()
            self.collectors.append(proc)
            self.by_collector_id[read_json(StatePaths(state).identity)["collector_id"]] = proc

    def redis_client(self) -> Redis:
        """A client of the Redis that holds the counters now (the master, in a Sentinel group)."""
        if isinstance(self.redis, SentinelGroup):
            return Redis(host=self.redis.host, port=self.redis.master_port())
        return Redis.from_url(self.redis.url)

    def stop(self) -> None:
        for proc in [*self.collectors, *self.services.values()]:
            proc.terminate(10)
        if hasattr(self, "proxy"):
            self.proxy.close()
        self.redis.stop()
        self.postgres.stop()
