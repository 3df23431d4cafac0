"""A scaled-out control plane on several hosts (network namespaces), as docs/deployment.md shows it.

Hosts: ``core1`` and ``core2`` (a router and an enrollment service each), ``edge1`` and ``edge2``
(a gateway each), ``lb`` (HAProxy running deploy/haproxy/haproxy.cfg as it is), ``site`` (the
collectors) and ``db``, whose near address in this namespace PostgreSQL and a Redis Sentinel group
listen on. Key material is shared through PostgreSQL; gateways hold no private key; every service
is the standalone process a systemd unit would run.
"""

from __future__ import annotations

import json
import os
import shlex
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.embedded.postgres import EmbeddedPostgres
from common.embedded.process import free_ports
from common.trust.ca_store import CaStore
from tests.e2e.harness import wait_grpc_serving
from tests.support.fabric import Host, Proc, python
from tests.support.sentinel import SentinelGroup

ROOT = Path(__file__).resolve().parents[2]
HAPROXY_CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
HOSTS = ("db", "core1", "core2", "edge1", "edge2", "lb", "site")
CORES, EDGES = ("core1", "core2"), ("edge1", "edge2")
ROUTER_PORT, ENROLLMENT_PORT, GATEWAY_PORT, LB_PORT = 50051, 50052, 8443, 443
ATTACH_PORT = 8445
GATEWAY_NAME = "gateway.versus.internal"
TENANT = "chaos"


def _log(process: Proc) -> str:
    return process.log_path.read_text(errors="replace") if process.log_path.exists() else ""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("VERSUS_", "DATABASE_URL", "REDIS_URL"))}


@dataclass
class Deployment:
    root: Path
    hosts: dict[str, Host]
    postgres: EmbeddedPostgres = field(init=False)
    redis: SentinelGroup = field(init=False)
    processes: dict[str, Proc] = field(default_factory=dict)
    collectors: list[Proc] = field(default_factory=list)
    site_id: str = ""
    platform_token: str = ""

    # --- addresses -------------------------------------------------------------------------------
    def address(self, host: str) -> str:
        return self.hosts[host].address

    def targets(self, port: int) -> str:
        return ",".join(f"{self.address(h)}:{port}" for h in CORES)

    @property
    def public_url(self) -> str:
        return f"https://{self.address('lb')}:{LB_PORT}"

    @property
    def devices(self) -> Path:
        return self.root / "devices"

    def gateway_ca(self) -> Path:
        return self.root / "gateway-ca.pem"

    # --- environments ----------------------------------------------------------------------------
    def base_env(self) -> dict[str, str]:
        return {
            **_clean_env(),
            "DATABASE_URL": self.postgres.url,
            "REDIS_URL": self.redis.url,
            "VERSUS_KEY_MATERIAL": "shared",
            "VERSUS_LOG_FORMAT": "json",
            "VERSUS_SHUTDOWN_GRACE_S": "3",
            "VERSUS_CLAIM_HOLD_S": "5",
            "VERSUS_ROUTER_TARGET": self.targets(ROUTER_PORT),
            "VERSUS_ENROLLMENT_TARGET": self.targets(ENROLLMENT_PORT),
            "VERSUS_GATEWAY_PUBLIC_URL": self.public_url,
            "VERSUS_GATEWAY_SERVER_NAME": self.address("lb"),
        }

    @property
    def material_key(self) -> Path:
        return self.root / "material.key"

    def operator_env(self) -> dict[str, str]:
        """An operator's workstation: this namespace, reaching the core hosts."""
        return {
            **self.base_env(),
            "VERSUS_STATE_DIR": str(self.root / "ops"),
            "VERSUS_MATERIAL_KEY_FILE": str(self.material_key),
        }

    def core_env(self, host: str) -> dict[str, str]:
        return {
            **self.base_env(),
            "VERSUS_STATE_DIR": str(self.root / host),
            "VERSUS_MATERIAL_KEY_FILE": str(self.material_key),
            "VERSUS_ROUTER_HOST": "0.0.0.0",
            "VERSUS_ENROLLMENT_HOST": "0.0.0.0",
            "VERSUS_ROUTER_ADVERTISE": f"{self.address(host)}:{ROUTER_PORT}",
        }

    def edge_env(self, host: str) -> dict[str, str]:
        tls = self.root / "tls" / host
        return {
            **self.base_env(),
            "VERSUS_STATE_DIR": str(self.root / host),
            "VERSUS_GATEWAY_HOST": "0.0.0.0",
            "VERSUS_GATEWAY_PORT": str(GATEWAY_PORT),
            # Platform clients (here: `versus-cp tunnel` on the test's host) and routers attach to
            # the tunnel sessions this gateway holds on its internal listener.
            "VERSUS_GATEWAY_ATTACH_HOST": "0.0.0.0",
            "VERSUS_GATEWAY_ATTACH_PORT": str(ATTACH_PORT),
            "VERSUS_GATEWAY_ATTACH_ADVERTISE": f"{self.address(host)}:{ATTACH_PORT}",
            "VERSUS_TLS_CERT_FILE": str(tls / "server.pem"),
            "VERSUS_TLS_KEY_FILE": str(tls / "server.key"),
            "VERSUS_GATEWAY_MAX_ANONYMOUS_PER_SOURCE": "0",
            "VERSUS_GATEWAY_DRAIN_S": "3",
            "VERSUS_SERVICE_TOKEN": (self.root / "service-token").read_text().strip(),
        }

    # --- operator commands -----------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True, token: str = "") -> subprocess.CompletedProcess[str]:
        """`versus-cp` as the operator (the bootstrap admin token), or with ``token``."""
        env = {**self.operator_env(), **({"VERSUS_API_TOKEN": token} if token else {})}
        done = subprocess.run(
            [sys.executable, "-m", "versus_cp", *args], env=env,
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"versus-cp {' '.join(args)}: {done.stderr}")
        return done

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    # --- bring-up --------------------------------------------------------------------------------
    def start_backends(self) -> None:
        db = self.hosts["db"].near
        self.postgres = EmbeddedPostgres(self.root / "pg", port=free_ports(1, db)[0], host=db).start()
        self.redis = SentinelGroup(self.root / "redis", db).start()

    def initialise(self) -> None:
        """Schema, the first admin token, the shared material, the edge's certificates."""
        self.cli("migrate")
        self.cli("access", "bootstrap")
        self.cli("material", "new-key", str(self.material_key))
        self.cli("material", "share")
        for host in EDGES:
            self.cli("ca", "issue-server-cert", "--name", GATEWAY_NAME, "--name", self.address(host),
                     "--out", str(self.root / "tls" / host))  # fmt: skip
        self.cli(
            "ca", "issue-server-cert", "--name", self.address("lb"), "--out", str(self.root / "tls" / "lb")
        )
        pems = CaStore(self.root / "ops").load().pems("gateway")
        self.gateway_ca().write_text("".join(pems))

    def _start(self, name: str, host: str, argv: list[str], env: dict[str, str]) -> Proc:
        process = Proc(name, self.hosts[host].argv(*argv), env, self.root / f"{name}.log")
        process.start()
        self.processes[name] = process
        return process

    def start_core(self, host: str) -> None:
        for service, port in (("router", ROUTER_PORT), ("enrollment", ENROLLMENT_PORT)):
            name = f"{service}-{host}"
            process = self._start(
                name, host, [sys.executable, "-m", "versus_cp", service], self.core_env(host)
            )
            assert process.proc is not None
            wait_grpc_serving(port, process.proc, process.log_path, host=self.address(host))

    def start_edge(self, host: str) -> None:
        process = self._start(
            f"gateway-{host}", host, [sys.executable, "-m", "versus_cp", "gateway"], self.edge_env(host)
        )
        self.wait_ready(f"https://{self.address(host)}:{GATEWAY_PORT}/readyz", process)

    def start_lb(self) -> None:
        env = {
            **_clean_env(),
            "VERSUS_LB_BIND": f"0.0.0.0:{LB_PORT}",
            "VERSUS_LB_MAXCONN": "4000",
            "VERSUS_LB_CERT": str(self.root / "tls" / "lb" / "server.bundle.pem"),
            "VERSUS_GATEWAY_CA": str(self.gateway_ca()),
            "VERSUS_GATEWAY_1": f"{self.address('edge1')}:{GATEWAY_PORT}",
            "VERSUS_GATEWAY_2": f"{self.address('edge2')}:{GATEWAY_PORT}",
        }
        checked = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CONFIG)], env=env, capture_output=True,
                                 text=True, check=False)  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr
        process = self._start("haproxy", "lb", ["haproxy", "-db", "-f", str(HAPROXY_CONFIG)], env)
        self.wait_ready(f"{self.public_url}/readyz", process)

    def wait_ready(self, url: str, process: Proc, timeout: float = 60) -> None:
        tls = ssl.create_default_context(cafile=str(self.gateway_ca()))
        tls.check_hostname = False  # an address; the certificate chain is what is checked here
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert process.running, _log(process)
            try:
                if httpx.get(url, verify=tls, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{url} not ready:\n{_log(process)}")

    def start(self) -> None:
        self.devices.mkdir(parents=True, exist_ok=True)
        self.start_backends()
        self.initialise()
        for host in CORES:
            self.start_core(host)
        token = self.cli_json("access", "create", "internal-services", "--role", "service")
        (self.root / "service-token").write_text(str(token["plaintext"]))
        platform = self.cli_json("access", "create", "platform", "--role", "platform", "--all-tenants")
        self.platform_token = str(platform["plaintext"])
        for host in EDGES:
            self.start_edge(host)
        self.start_lb()

    # --- collectors ------------------------------------------------------------------------------
    def enroll_command(self, uses: int) -> tuple[list[str], str]:
        if not self.site_id:
            self.site_id = str(
                self.cli_json("sites", "create", "site-multi", "--tenant", TENANT)["site"]["site_id"]
            )
        issued = self.cli_json("tokens", "issue", "--site", self.site_id, "--max-uses", str(uses))
        return shlex.split(str(issued["enroll_command"]))[1:], str(issued["plaintext"])

    def collector_env(self) -> dict[str, str]:
        return {**_clean_env(), "VERSUS_STUB_DEVICE_DIR": str(self.devices)}

    def enroll(self, name: str, command: list[str], token: str) -> str:
        """Enroll a collector from the site host, through the balancer; its id."""
        state = self.root / name
        done = subprocess.run(
            python(self.hosts["site"], "-m", "collector", *command, "--state-dir", str(state)),
            input=token + "\n", env=self.collector_env(), capture_output=True, text=True, timeout=90,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return str(json.loads((state / "identity.json").read_text())["collector_id"])

    def start_collector(self, name: str) -> Proc:
        argv = [sys.executable, "-m", "collector", "run", "--state-dir", str(self.root / name),
                "--claim-wait", "2", "--grace", "5", "--max-backoff", "1"]  # fmt: skip
        process = Proc(name, self.hosts["site"].argv(*argv), self.collector_env(), self.root / f"{name}.log")
        process.start()
        self.collectors.append(process)
        return process

    def gateway_logs(self) -> list[Path]:
        return [self.root / f"gateway-{h}.log" for h in EDGES]

    def stop(self) -> None:
        for process in [*self.collectors, *reversed(self.processes.values())]:
            process.terminate(10)
        if hasattr(self, "redis"):
            self.redis.stop()
        if hasattr(self, "postgres"):
            self.postgres.stop()
