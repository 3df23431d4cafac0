"""Several test hosts that reach each other: network namespaces routed through this one.

Each host is a namespace with its own address on a /30 link to this namespace
(tests/support/netns.py makes the links); every host's default route points here
and this namespace forwards between them, so host A dials host B's address as
across a LAN. This namespace also owns the near end of every link: a server bound
to one of those addresses here (the database, say) is a host of its own.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.stack import Proc
from tests.support import netns

__all__ = ["FORWARDING", "Host", "Proc", "fabric", "python"]

FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str  # the host's own address
    near: str  # this namespace's end of the host's link (a server here bound to it is reachable)

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside this host (``ip netns exec`` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.namespace, *command]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def fabric(names: Sequence[str]) -> Iterator[dict[str, Host]]:
    """Hosts named ``names``, routed to each other; removed (and forwarding restored) afterwards."""
    before = FORWARDING.read_text().strip()
    FORWARDING.write_text("1\n")
    try:
        with contextlib.ExitStack() as stack:
            hosts: dict[str, Host] = {}
            # Consecutive /30s from a random start: no two hosts of this fabric share an address.
            first = secrets.randbelow(16384 - len(names))
            for i, name in enumerate(names):
                made = stack.enter_context(netns.host(first + i))
                near = _near(made)
                _ip("netns", "exec", made.namespace, "ip", "route", "add", "default", "via", near)
                hosts[name] = Host(name, made.namespace, made.address, near)
            yield hosts
    finally:
        FORWARDING.write_text(before + "\n")


def _near(host: netns.Host) -> str:
    """The address this namespace has on the host's /30 (one below the host's)."""
    *head, last = host.address.split(".")
    return ".".join([*head, str(int(last) - 1)])


def python(host: Host, *args: str) -> list[str]:
    """This interpreter running ``args`` (``-m versus_cp router``, say) inside ``host``."""
    return host.argv(sys.executable, *args)
