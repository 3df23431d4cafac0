"""Test hosts of their own: a network namespace joined to this one by a veth pair, and Debian's
OpenSSH server running inside it on port 22 (installed by `make system-deps`).

A namespace gives a device its own address, so it can listen on a well-known port (22) without
colliding with anything on this machine — which is how real network gear looks to a collector.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str  # the namespace's side of the link, reachable from here


@contextlib.contextmanager
def host(block: int | None = None) -> Iterator[Host]:
    """A network namespace with its own address, reachable from this one; removed afterwards.
    ``block`` picks its /30 (0-16383); by default one at random."""
    tag = secrets.token_hex(3)
    namespace, outside, inside = f"vs-{tag}", f"vso{tag}", f"vsi{tag}"
    # A /30 in 10.213.0.0/16 picked at random, so concurrent runs rarely meet.
    block = (secrets.randbelow(16384) if block is None else block) * 4
    ours, theirs = f"10.213.{block // 256}.{block % 256 + 1}", f"10.213.{block // 256}.{block % 256 + 2}"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", namespace)
        _ip("addr", "add", f"{ours}/30", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"{theirs}/30", "dev", inside)
        _ip("netns", "exec", namespace, "ip", "link", "set", inside, "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        yield Host(namespace, theirs)
    finally:
        subprocess.run(["ip", "link", "del", outside], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@dataclass(frozen=True)
class OpenSsh:
    address: str
    port: int
    host_key: str  # "ssh-ed25519 AAAA..." as a collector pins it
    client_key: Path  # private key the server accepts for root
    pid: int = 0  # the listening sshd (each session is a child of it)

    def sessions(self) -> int:
        """Live sshd session processes (children of the listener), as the OS sees them."""
        try:
            return len(psutil.Process(self.pid).children())
        except psutil.NoSuchProcess:
            return 0


@contextlib.contextmanager
def openssh_server(where: Host, directory: Path) -> Iterator[OpenSsh]:
    """OpenSSH's sshd on port 22 inside ``where``, accepting one generated client key for root."""
    if not Path(SSHD).exists() or shutil.which("ssh-keygen") is None:
        raise RuntimeError("OpenSSH server missing: run `make system-deps` (make test does)")
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / name)], check=True
        )
    (directory / "authorized_keys").write_text((directory / "client_key.pub").read_text())
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"ListenAddress {where.address}:22",
                f"HostKey {directory / 'host_key'}",
                f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                f"PidFile {directory / 'sshd.pid'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    log = (directory / "sshd.log").open("w")
    process = subprocess.Popen(
        ["ip", "netns", "exec", where.namespace, SSHD, "-D", "-e", "-f", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((where.address, 22), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd did not start: {(directory / 'sshd.log').read_text()}"
                    ) from None
                time.sleep(0.05)
        public = (directory / "host_key.pub").read_text().split()
        # `ip netns exec` execs sshd in its own place: the process is the listener.
        yield OpenSsh(where.address, 22, f"{public[0]} {public[1]}", directory / "client_key", process.pid)
    finally:
        process.terminate()
        process.wait(10)
        log.close()
