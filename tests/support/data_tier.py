"""The highly available data tier of deploy/ for tests: etcd members (Debian etcd-server) and
PostgreSQL 15 nodes under Patroni (Debian patroni), on free ports of one address.

Every etcd member starts with deploy/etcd/etcd.env and every Patroni node with
deploy/patroni/patroni.yml, unchanged; only what a per-node environment file would hold (names,
addresses, directories, passwords) is added, as docs/deployment.md tells an operator to. Patroni
and PostgreSQL run as the ``postgres`` user (PostgreSQL refuses root).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import secrets
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from common.embedded.process import allow_traverse, free_ports, spawn_server, stop_process

ROOT = Path(__file__).resolve().parents[2]
ETCD_ENV = ROOT / "deploy" / "etcd" / "etcd.env"
PATRONI_YML = ROOT / "deploy" / "patroni" / "patroni.yml"
ETCD, PATRONI = "/usr/bin/etcd", "/usr/bin/patroni"
ROLE = DATABASE = "versus"


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a systemd EnvironmentFile (comments and blank lines skipped)."""
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        time.sleep(0.2)


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class PatroniNode:
    name: str
    pg_port: int
    api_port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None


@dataclass
class DataTier:
    """A running etcd + Patroni cluster; ``url`` is what the control plane is given."""

    directory: Path
    nodes: int = 2
    members: int = 3
    host: str = "127.0.0.1"
    etcd: dict[str, EtcdMember] = field(default_factory=dict)
    patroni: dict[str, PatroniNode] = field(default_factory=dict)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    superuser_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    replication_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))

    # --- addresses ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The libpq multi-host URL the services use: every node, and only a writable one will do."""
        hosts = ",".join(f"{self.host}:{n.pg_port}" for n in self.patroni.values())
        return (
            f"postgresql://{ROLE}:{quote(self.password, safe='')}@{hosts}/{DATABASE}"
            "?target_session_attrs=read-write&connect_timeout=3"
        )

    def superuser_url(self, node: str, database: str = "postgres") -> str:
        n = self.patroni[node]
        return (
            f"postgresql://postgres:{quote(self.superuser_password, safe='')}@{self.host}:{n.pg_port}/"
            f"{database}?connect_timeout=3"
        )

    def etcd_hosts(self) -> str:
        return ",".join(f"{self.host}:{m.client_port}" for m in self.etcd.values())

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> DataTier:
        ports = iter(free_ports(2 * self.members + 2 * self.nodes, self.host))
        for i in range(1, self.members + 1):
            name = f"etcd-{i}"
            self.etcd[name] = EtcdMember(name, next(ports), next(ports), self.directory / name)
        for i in range(1, self.nodes + 1):
            name = f"pg-{i}"
            self.patroni[name] = PatroniNode(name, next(ports), next(ports), self.directory / name)
        for member in self.etcd.values():
            self.start_member(member.name, initial=True)
        wait_until(self._etcd_healthy, 60, "etcd has a quorum")
        for node in self.patroni.values():
            self.start_node(node.name)
        wait_until(self.replicated, timeout, "Patroni has a leader and a synchronous standby")
        with psycopg.connect(self.superuser_url(self.leader()), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{self.password}'")
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        return self

    def stop(self) -> None:
        for node in self.patroni.values():
            self._stop_node(node, signal.SIGTERM)
        for member in self.etcd.values():
            if member.proc is not None:
                stop_process(member.proc, signal.SIGTERM, 10)

    # --- etcd -----------------------------------------------------------------------------------
    def start_member(self, name: str, *, initial: bool = False) -> None:
        member = self.etcd[name]
        member.directory.mkdir(parents=True, exist_ok=True)
        peers = ",".join(f"{m.name}=http://{self.host}:{m.peer_port}" for m in self.etcd.values())
        env = {
            **read_env_file(ETCD_ENV),
            "ETCD_NAME": name,
            "ETCD_DATA_DIR": str(member.directory / "data"),
            "ETCD_LISTEN_PEER_URLS": f"http://{self.host}:{member.peer_port}",
            "ETCD_INITIAL_ADVERTISE_PEER_URLS": f"http://{self.host}:{member.peer_port}",
            "ETCD_LISTEN_CLIENT_URLS": f"http://{self.host}:{member.client_port}",
            "ETCD_ADVERTISE_CLIENT_URLS": f"http://{self.host}:{member.client_port}",
            "ETCD_INITIAL_CLUSTER": peers,
            "PATH": "/usr/bin:/bin",
        }
        if not initial:
            env["ETCD_INITIAL_CLUSTER_STATE"] = "existing"
        member.proc = spawn_server([ETCD], member.directory / "etcd.log", signal.SIGKILL, env=env)

    def kill_member(self, name: str) -> None:
        """SIGKILL one etcd member (its data stays: ``start_member`` brings it back)."""
        proc = self.etcd[name].proc
        assert proc is not None
        proc.kill()
        proc.wait()

    def _etcd_healthy(self) -> bool:
        healthy = 0
        for member in self.etcd.values():
            try:
                with urllib.request.urlopen(
                    f"http://{self.host}:{member.client_port}/health", timeout=1
                ) as r:
                    healthy += json.loads(r.read()).get("health") == "true"
            except OSError:
                pass
        return healthy > len(self.etcd) // 2

    # --- Patroni --------------------------------------------------------------------------------
    def start_node(self, name: str) -> None:
        node = self.patroni[name]
        entry = pwd.getpwnam("postgres")
        node.directory.mkdir(parents=True, exist_ok=True)
        for path in (node.directory,):
            os.chown(path, entry.pw_uid, entry.pw_gid)
            path.chmod(0o700)
        allow_traverse(node.directory)
        address = f"{self.host}:{node.pg_port}"
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(node.directory),
            "PATRONI_NAME": name,
            "PATRONI_RESTAPI_LISTEN": f"{self.host}:{node.api_port}",
            "PATRONI_RESTAPI_CONNECT_ADDRESS": f"{self.host}:{node.api_port}",
            "PATRONI_POSTGRESQL_LISTEN": address,
            "PATRONI_POSTGRESQL_CONNECT_ADDRESS": address,
            "PATRONI_POSTGRESQL_DATA_DIR": str(node.data_dir),
            "PATRONI_POSTGRESQL_PGPASS": str(node.directory / "pgpass"),
            "PATRONI_ETCD3_HOSTS": self.etcd_hosts(),
            "PATRONI_SUPERUSER_PASSWORD": self.superuser_password,
            "PATRONI_REPLICATION_PASSWORD": self.replication_password,
            "PATRONI_RESTAPI_USERNAME": "patroni",
            "PATRONI_RESTAPI_PASSWORD": self.superuser_password,
        }
        node.proc = spawn_server(
            [PATRONI, str(PATRONI_YML)], node.directory / "patroni.log", signal.SIGKILL,
            run_as=(entry.pw_uid, entry.pw_gid), cwd=node.directory, env=env,
        )  # fmt: skip

    def kill_node(self, name: str) -> None:
        """The node dies whole: SIGKILL to Patroni and to PostgreSQL with every backend."""
        self._stop_node(self.patroni[name], signal.SIGKILL)

    def _stop_node(self, node: PatroniNode, sig: signal.Signals) -> None:
        if node.proc is not None and node.proc.poll() is None:
            if sig == signal.SIGKILL:
                node.proc.kill()
                node.proc.wait()
            else:
                stop_process(node.proc, sig, 60)  # Patroni stops its PostgreSQL first
        pid = node.postmaster_pid()
        if pid is not None:
            # Patroni starts the postmaster in a session of its own (led by a helper process that
            # has exited): the group holds the postmaster and every backend.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)

    def switchover(self, leader: str, candidate: str) -> str:
        """A planned move of the primary (what ``patronictl switchover`` asks the REST API): the
        leader is demoted, its PostgreSQL restarted as a standby, the candidate promoted. Patroni
        answers once the candidate leads; its answer is returned."""
        body = json.dumps({"leader": leader, "candidate": candidate}).encode()
        auth = base64.b64encode(f"patroni:{self.superuser_password}".encode()).decode()
        request = urllib.request.Request(
            f"http://{self.host}:{self.patroni[leader].api_port}/switchover", data=body, method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Basic {auth}"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as reply:  # noqa: S310 - http://, built above
            answer: bytes = reply.read()
        return answer.decode()

    def cluster(self) -> list[dict[str, Any]]:
        """Patroni's view of the members (from any node whose REST API answers)."""
        for node in self.patroni.values():
            if node.proc is None or node.proc.poll() is not None:
                continue
            try:
                with urllib.request.urlopen(f"http://{self.host}:{node.api_port}/cluster", timeout=2) as r:
                    return list(json.loads(r.read()).get("members", []))
            except OSError:
                continue
        return []

    def leader(self) -> str:
        leaders = [
            m["name"] for m in self.cluster() if m.get("role") == "leader" and m.get("state") == "running"
        ]
        if not leaders:
            raise LookupError("no running leader")
        return str(leaders[0])

    def sync_standby(self) -> str | None:
        names = [m["name"] for m in self.cluster() if m.get("role") == "sync_standby"]
        return str(names[0]) if names else None

    def replicated(self) -> bool:
        """A running leader, and every other live node streaming from it, one synchronously."""
        members = self.cluster()
        live = [n for n in self.patroni.values() if n.proc is not None and n.proc.poll() is None]
        roles = {m["name"]: (m.get("role"), m.get("state")) for m in members}
        leaders = [n for n, (role, state) in roles.items() if role == "leader" and state == "running"]
        others = [n.name for n in live if n.name not in leaders]
        streaming = all(roles.get(n, (None, None))[1] in {"streaming", "running"} for n in others)
        has_sync = not others or any(roles.get(n, (None, None))[0] == "sync_standby" for n in others)
        return len(leaders) == 1 and streaming and has_sync
