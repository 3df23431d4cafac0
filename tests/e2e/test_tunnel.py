"""A device session through control plane and collector: OpenSSH with `versus-cp tunnel` as ProxyCommand."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from common.config.state_dir import write_private
from common.embedded.process import free_port
from tests.e2e.collector_harness import Collector
from tests.e2e.harness import ControlPlane, run_cli
from tests.support import netns
from tests.support.devices import EchoDevice, HttpsDevice, SshDevice

SESSIONS = 20

pytestmark = pytest.mark.timeout(180)


def _wait_live(collector: Collector) -> None:
    """The collector is routable once it has published its capabilities and claimed once."""
    deadline = time.monotonic() + 30
    while "control socket open" not in collector.log() and "capabilities published" not in collector.log():
        assert time.monotonic() < deadline, collector.log()
        time.sleep(0.1)
    time.sleep(0.5)


def _ssh_command(collector: Collector, device: SshDevice, tmp_path: Path, remote: str) -> list[str]:
    """OpenSSH to the device with `versus-cp tunnel` as its ProxyCommand (as an operator would)."""
    key = device.write_client_key(tmp_path / "id_ed25519")
    proxy = shlex.join([sys.executable, "-m", "versus_cp", "tunnel", "--target", f"127.0.0.1:{device.port}",
                        "--site", collector.site_id, "--tenant", "acme"])  # fmt: skip
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", f"ProxyCommand={proxy}", "-i", str(key),
            f"{device.username}@device-behind-the-collector", remote]  # fmt: skip


def test_openssh_through_a_tunnel(shared_control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    device = SshDevice()
    try:
        collector.start()
        _wait_live(collector)
        command = _ssh_command(collector, device, tmp_path, "uname -s; echo tunnelled")
        done = subprocess.run(command, env=cp.env, capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["Linux", "tunnelled"]
        assert device.commands == ["uname -s; echo tunnelled"]
        assert "tunnel open" in collector.log()
    finally:
        collector.stop()
        device.close()


def _openssh_command(collector: Collector, device: netns.OpenSsh, remote: str) -> list[str]:
    """OpenSSH to a real sshd with `versus-cp tunnel` as its ProxyCommand, pinning its host key."""
    known = device.client_key.parent / "known_hosts"
    known.write_text(f"device-behind-the-collector {device.host_key}\n")
    proxy = shlex.join([sys.executable, "-m", "versus_cp", "tunnel", "--target", f"{device.address}:22",
                        "--site", collector.site_id, "--tenant", "acme"])  # fmt: skip
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known}", "-o", f"ProxyCommand={proxy}", "-i", str(device.client_key),
            "root@device-behind-the-collector", remote]  # fmt: skip


def _connections_to(address: str, port: int) -> int:
    """Established TCP connections from here to ``address:port``, as the OS sees them."""
    return sum(
        1
        for c in psutil.net_connections(kind="tcp")
        if c.raddr and (c.raddr.ip, c.raddr.port) == (address, port) and c.status == psutil.CONN_ESTABLISHED
    )


def test_every_ssh_session_closes_its_device_connection(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    """OpenSSH's ssh exits and kills its ProxyCommand: the collector's connection to the device
    (Debian's sshd, in a network namespace of its own) must end too, and with it the sshd session,
    which on real gear holds one of its few VTY lines. A normal open/close logs no error."""
    cp = shared_control_plane
    mark = cp.log_mark()
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    with netns.host() as where, netns.openssh_server(where, tmp_path / "sshd") as device:
        try:
            collector.start()
            _wait_live(collector)
            for n in range(SESSIONS):
                command = _openssh_command(collector, device, f"echo session-{n}")
                done = subprocess.run(
                    command, env=cp.env, capture_output=True, text=True, timeout=60, check=False
                )
                assert done.returncode == 0, done.stderr
                assert done.stdout.strip() == f"session-{n}"
                deadline = time.monotonic() + 2
                while (
                    _connections_to(device.address, 22) or device.sessions()
                ) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert _connections_to(device.address, 22) == 0, (
                    f"session {n} left its device connection open"
                )
                assert device.sessions() == 0, f"session {n} left its sshd session running"
            logged = cp.log_since(mark) + collector.log()
            assert "Traceback" not in logged
            assert "[error" not in logged and '"level": "error"' not in logged
        finally:
            collector.stop()


def test_an_unreachable_target_is_reported_at_once(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The collector knows at once that nothing listens there; the platform must not wait for a
    dial-back timeout (30 s). Afterwards no session record is left in Redis."""
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    try:
        collector.start()
        _wait_live(collector)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "versus_cp", "tunnel", "--target", f"127.0.0.1:{free_port()}",
             "--site", collector.site_id, "--tenant", "acme"],
            env=cp.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        assert done.returncode == 1
        assert "tunnel closed: target_unreachable" in done.stderr
        assert time.monotonic() - started < 10
        client = redis.Redis.from_url(f"unix://{cp.state_dir / 'redis' / 'redis.sock'}")
        try:
            # This collector's sessions (the control plane is shared with the module's other tests).
            records = [client.get(key) for key in client.scan_iter(match="versus:tunnel:*")]
            assert [r for r in records if r and json.loads(r)["collector_id"] == collector_id] == []
        finally:
            client.close()
    finally:
        collector.stop()


def test_tunnel_without_a_live_collector_fails_clearly(
    shared_control_plane: ControlPlane,
) -> None:
    cp = shared_control_plane

    def tunnel(site: str, tenant: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "versus_cp", "tunnel", "--target", "127.0.0.1:22", "--site", site,
             "--tenant", tenant],
            env=cp.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip

    done = tunnel("site-none", "acme")
    assert done.returncode == 4  # not found
    assert done.stderr.strip() == "versus-cp: error: tenant 'acme' has no site 'site-none' (site_not_found)"
    site = cp.api.create_site("empty")["site"]["site_id"]
    assert tunnel(site, "nope").returncode == 4  # another tenant's site looks like no site
    done = tunnel(site, "acme")
    assert done.returncode == 5  # refused in the current state
    assert (
        done.stderr.strip()
        == f"versus-cp: error: no live collector serves site {site!r} (no_eligible_collector)"
    )


def _tunnel_cli(
    cp: ControlPlane, collector: Collector, port: int, stdin: Any, stdout: Any
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "versus_cp",
            "tunnel",
            "--target",
            f"127.0.0.1:{port}",
            "--site",
            collector.site_id,
            "--tenant",
            "acme",
        ],
        env=cp.env,
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
    )


def _open_echo_tunnel(cp: ControlPlane, collector: Collector, echo: EchoDevice) -> subprocess.Popen[bytes]:
    """A `versus-cp tunnel` to the echo device with all three pipes, proven to carry bytes."""
    proc = _tunnel_cli(cp, collector, echo.port, subprocess.PIPE, subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"ping\n")
    proc.stdin.flush()
    assert proc.stdout.read(5) == b"ping\n"
    return proc


def _ended_with(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, bytes]:
    """Exit code and stderr of a tunnel command whose stdin is still open (as under ssh)."""
    code = proc.wait(timeout)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stderr = proc.stderr.read()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        pipe.close()
    return code, stderr


def test_64_mib_round_trip_byte_exact(shared_control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    echo = EchoDevice()
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(64 * 1024 * 1024))
    try:
        collector.start()
        _wait_live(collector)
        with payload.open("rb") as stdin, (tmp_path / "echoed.bin").open("wb") as stdout:
            proc = _tunnel_cli(cp, collector, echo.port, stdin, stdout)
            _, stderr = proc.communicate(timeout=150)
        assert proc.returncode == 0, stderr.decode()
        echoed = (tmp_path / "echoed.bin").read_bytes()
        assert len(echoed) == 64 * 1024 * 1024
        assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload.read_bytes()).digest()
    finally:
        collector.stop()
        echo.close()


def test_killing_the_collector_closes_the_tunnel_with_a_reason(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    echo = EchoDevice()
    try:
        collector.start()
        _wait_live(collector)
        proc = _open_echo_tunnel(cp, collector, echo)
        collector.kill()
        code, stderr = _ended_with(proc, 60)
        assert code == 1
        assert b"versus-cp: tunnel closed: collector_gone" in stderr
    finally:
        collector.stop()
        echo.close()


def test_an_http_tunnel_carries_the_collectors_local_credential(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    device = HttpsDevice(tmp_path / "device")
    secret = "lb-token-only-the-collector-knows"
    credentials = {
        "http": {"lb-1": device.credentials(secret)},
        "tunnels": {f"127.0.0.1:{device.port}": {"inject": "http", "target_ref": "lb-1"}},
    }
    write_private(collector.state / "credentials.json", json.dumps(credentials).encode())
    try:
        collector.start()
        _wait_live(collector)
        proc = _tunnel_cli(cp, collector, device.port, subprocess.PIPE, subprocess.PIPE)
        # Plain HTTP in; the collector speaks TLS to the device and adds the credential.
        request = b"GET /api/status HTTP/1.1\r\nHost: lb-1\r\nConnection: close\r\n\r\n"
        stdout, stderr = proc.communicate(request, timeout=60)
        assert proc.returncode == 0, stderr.decode()
        assert stdout.startswith(b"HTTP/1.1 200 "), stdout
        assert b'"path":"/api/status"' in stdout
        assert device.requests == [("GET", "/api/status", f"Bearer {secret}")]
        assert secret.encode() not in stdout
        assert secret not in cp.log() + collector.log()
    finally:
        collector.stop()
        device.close()


def test_revoking_the_collector_tears_down_its_open_tunnel(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane  # it revokes its own collector only
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    echo = EchoDevice()
    try:
        collector.start()
        _wait_live(collector)
        proc = _open_echo_tunnel(cp, collector, echo)
        # The operator's revoke: the enrollment service writes the status, the router broadcasts it
        # to the gateways (which close the collector's sockets, the tunnel's among them) and flags it.
        # (A status written by hand in SQL is only seen by the gateways' periodic sweep, 60 s.)
        revoked = run_cli(["collectors", "revoke", collector_id, "--reason", "lost"], cp.env)
        assert revoked.returncode == 0, revoked.stderr
        code, stderr = _ended_with(proc, 30)
        assert code == 1
        assert b"versus-cp: tunnel closed: collector_gone" in stderr
    finally:
        collector.stop()
        echo.close()
