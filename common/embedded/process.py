"""Process helpers shared by the embedded servers and the `up` supervisor."""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

_PR_SET_PDEATHSIG = 1
# Unix socket paths are limited to 108 bytes including the terminator.
MAX_SOCKET_PATH = 100


def parent_death_signal(sig: int) -> Callable[[], None]:
    """A ``preexec_fn`` asking Linux to send ``sig`` to the child when its parent dies.

    It runs in the child after any uid change, so the setting survives it. This is
    what keeps a SIGKILLed supervisor from leaving orphaned servers behind.
    """

    def _set() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - non-Linux
            pass

    return _set


# util-linux's setpriv (Essential in Debian) sets the parent-death signal and drops privileges in
# the child without any Python running there (see spawn_server).
SETPRIV = shutil.which("setpriv")


def run_as_prefix(run_as: tuple[int, int] | None) -> tuple[list[str], dict[str, Any]]:
    """How to run a command as ``run_as`` (uid, gid, no supplementary groups): a setpriv prefix,
    or, without setpriv, the subprocess arguments that do it. setpriv first, for the reason
    :func:`spawn_server` gives: CPython cannot vfork a child it must switch users in, so it forks,
    and the at-fork handlers of a process with live gRPC pollers can break that child before it
    execs (initdb failed so in a test process that had used gRPC)."""
    if run_as is None:
        return [], {}
    if SETPRIV is not None:
        return [SETPRIV, f"--reuid={run_as[0]}", f"--regid={run_as[1]}", "--clear-groups"], {}
    return [], {"user": run_as[0], "group": run_as[1], "extra_groups": []}


def death_signal_spawn(death_signal: int) -> tuple[list[str], dict[str, Any]]:
    """How to have Linux send ``death_signal`` to a child when its parent dies: a setpriv prefix
    for its command (nothing runs in the forked child), or, without setpriv, the ``preexec_fn``
    that does it. Every spawn in a process that may hold gRPC channels wants the prefix: a
    ``preexec_fn`` makes CPython fork instead of vfork, and gRPC's at-fork handlers then run in
    the child, which has been seen to hang there and never exec (an OpenBao that did not start)."""
    if SETPRIV is not None:
        return [SETPRIV, "--pdeathsig", signal.Signals(death_signal).name.removeprefix("SIG")], {}
    return [], {"preexec_fn": parent_death_signal(death_signal)}


def spawn_server(
    cmd: list[str],
    log_file: Path,
    death_signal: int,
    *,
    run_as: tuple[int, int] | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a server child with its output appended to ``log_file`` (and ``env`` as its whole
    environment when given).

    The child gets its own session, so a terminal Ctrl-C never reaches it before
    the services using it have drained (its owner stops it explicitly), and a
    parent-death signal, so it does not outlive its owner. ``run_as`` (uid, gid)
    drops root to that user and group, with no supplementary groups.

    With setpriv the child runs no Python between fork and exec: a ``preexec_fn``
    makes CPython run the at-fork handlers of every library loaded in the parent,
    and gRPC's, in a process that has live gRPC channels (the chaos runner
    restarting PostgreSQL), can break the child before it execs.
    """
    if SETPRIV is not None:
        prefix = [SETPRIV]
        if run_as is not None:
            prefix += [f"--reuid={run_as[0]}", f"--regid={run_as[1]}", "--clear-groups"]
        prefix += ["--pdeathsig", signal.Signals(death_signal).name.removeprefix("SIG")]
        with open(log_file, "ab") as log:
            return subprocess.Popen(
                [*prefix, *cmd], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=cwd, env=env,
            )  # fmt: skip
    identity: dict[str, Any] = {}
    if run_as is not None:
        identity = {"user": run_as[0], "group": run_as[1], "extra_groups": []}
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=parent_death_signal(death_signal),
            cwd=cwd,
            env=env,
            **identity,
        )


def stop_process(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> int | None:
    """Send ``sig``, wait up to ``timeout``, then SIGKILL. Returns the exit status."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(5)
        except ProcessLookupError:
            pass
    return proc.poll()


def short_socket_dir(preferred: Path, name: str) -> Path:
    """``preferred`` if a socket path inside it fits the kernel limit, else a private dir in /tmp."""
    if len(str(preferred / name)) <= MAX_SOCKET_PATH:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    return Path(tempfile.mkdtemp(prefix="versus-"))


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (for tests and second instances)."""
    return free_ports(1, host)[0]


# Set by use_port_range: [low, high] and the next port to try.
_port_range: tuple[int, int] | None = None
_next_port = 0


def use_port_range(low: int, high: int) -> None:
    """From now on, pick free ports in turn from ``[low, high]`` rather than from the kernel.

    Two processes that pick ports from the kernel's ephemeral range can be handed the same port
    between one choosing it and binding it. Parallel test workers each get a range of their own,
    outside the ephemeral range, so no other process picks theirs.
    """
    global _port_range, _next_port
    _port_range, _next_port = (low, high), low


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct unused TCP ports: all are held open until every one is chosen, so
    the kernel cannot hand the same port out twice (separate free_port calls can collide)."""
    socks: list[socket.socket] = []
    try:
        if _port_range is None:
            for _ in range(count):
                socks.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                socks[-1].bind((host, 0))
        else:
            socks = _bind_from_range(count, host, *_port_range)
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _bind_from_range(count: int, host: str, low: int, high: int) -> list[socket.socket]:
    global _next_port
    socks: list[socket.socket] = []
    for _ in range(high - low + 1):
        if len(socks) == count:
            return socks
        port, _next_port = _next_port, (low if _next_port >= high else _next_port + 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        socks.append(sock)
    if len(socks) == count:
        return socks
    for sock in socks:
        sock.close()
    raise OSError(f"no {count} free ports left in {low}-{high}")


def tail(path: Path, lines: int = 5) -> str:
    """Last lines of a log file, for error messages."""
    try:
        content = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(content[-lines:])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is running (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


SIGTERM = signal.SIGTERM
SIGINT = signal.SIGINT


def allow_traverse(path: Path) -> None:
    """Add the others-execute bit to ``path`` and each parent so another user can reach it."""
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)
