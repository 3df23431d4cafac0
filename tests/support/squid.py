"""A real forward proxy for tests: Debian's squid, allowing CONNECT from loopback, as corporate egress does.

Installed by ``make system-deps``. Each proxy runs in the foreground on its own
port with its own configuration, logs and PID file under a test directory; its
access log shows every CONNECT it carried.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from types import TracebackType

from common.embedded.process import free_port


def kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL a test server started in its own session, with anything it started, and reap it."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


CONFIG = """\
http_port 127.0.0.1:{port}
pid_filename {root}/squid.pid
access_log stdio:{root}/access.log
cache_log {root}/cache.log
cache deny all
cache_mem 8 MB
coredump_dir {root}
netdb_filename none
pinger_enable off
acl loopback src 127.0.0.0/8
http_access allow loopback
http_access deny all
shutdown_lifetime 0 seconds
"""


class ForwardProxy:
    """``with ForwardProxy(dir) as proxy:`` — squid on ``proxy.url`` until the block ends."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ForwardProxy:
        binary = shutil.which("squid") or "/usr/sbin/squid"
        self.root.mkdir(parents=True, exist_ok=True)
        # squid started as root drops to its own user, which must be able to write its logs here
        # and to reach this directory (pytest makes its temporary directories 0700).
        os.chmod(self.root, 0o777)  # noqa: S103 - a throwaway test directory
        for parent in self.root.parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                parent.chmod(mode | stat.S_IXOTH)
        (self.root / "squid.conf").write_text(CONFIG.format(port=self.port, root=self.root))
        out = open(self.root / "squid.out", "wb")
        self.proc = subprocess.Popen(
            [binary, "-N", "-f", str(self.root / "squid.conf")],
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        out.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"squid did not start: {self.log()}") from None
                time.sleep(0.1)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        kill_group(self.proc)

    def connects(self, port: int) -> int:
        """How many CONNECT tunnels to a loopback ``port`` the proxy carried (logged when they close)."""
        log = self.root / "access.log"
        text = log.read_text() if log.exists() else ""
        targets = (f"CONNECT 127.0.0.1:{port} ", f"CONNECT localhost:{port} ")
        return sum(
            1 for line in text.splitlines() if "TCP_TUNNEL/200" in line and any(t in line for t in targets)
        )

    def log(self) -> str:
        parts = [self.root / "squid.out", self.root / "cache.log"]
        return "\n".join(p.read_text(errors="replace") for p in parts if p.exists())
